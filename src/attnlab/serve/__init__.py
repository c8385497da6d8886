"""The web face of attnlab: `attnlab serve`, a page and an OpenAI-compatible HTTP API over trained runs.

One process holds every model it was given and answers for all of them: language models through
`POST /v1/completions` (the OpenAI legacy completions API, streamed as server-sent events or not),
translation, classification and tagging runs through their own endpoints, the attention of any
text model through `POST /v1/attention`. Concurrent completions of one model are decoded together
by its `worker.ModelWorker` (continuous batching). To serve more traffic, run several processes
behind any HTTP load balancer: they share nothing.

Modules: `limits` (the caps a server enforces), `schemas` (request and response bodies), `errors`
(OpenAI-shaped JSON errors), `registry` (a loaded run and what it can do), `completions` (the
completion endpoint's streaming), `app` (`create_app` and the routes), `worker` (the decoding
thread), `static/` (the page: plain HTML, CSS and JavaScript, served by attnlab itself).

Needs the `serve` extra (fastapi, uvicorn): `pip install 'attnlab[serve]'` or `make serve`.
"""
