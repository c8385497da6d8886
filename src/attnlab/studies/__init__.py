"""Measuring: what is learned and what it costs, built on training and the models.

    ablation.py   `attnlab ablate`: variants of one configuration, trained the same way, compared
    scaling.py    `attnlab scale`: model sizes against loss, fitted to a power law
    sweep.py      many runs, resumable, one after another or in parallel (what the two above share)
    backends.py   where a sweep's runs train: this machine (the default) or a Ray cluster (`--backend ray`)
    seeds.py      one configuration over several seeds, mean ± sd (`attnlab train --seeds`)
    measure.py    a run's parameters and counted training FLOPs per token
    cost/         `attnlab cost`: the lectures' cost table, measured
    receptive.py  `attnlab cost --autoregressive`: receptive fields and sequential steps, counted
    bench/        `attnlab bench`: side-by-side speed, MFU, bandwidth roofline, attention memory

The modules are imported by name (`from attnlab.studies.cost import ...`); this package imports
none of them, so naming it costs nothing.
"""
