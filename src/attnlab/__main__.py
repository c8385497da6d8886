import os
import sys

from attnlab.cli import main

code = main()
if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
    # A worker under torchrun leaves without the interpreter's teardown: there the autograd engine's
    # and gloo's threads can deadlock against the finalising interpreter (pytorch/pytorch#42132 and
    # #190489), which left a finished job's process alive and its launcher waiting. Its work is done
    # and its files closed by now; only the buffered output remains to write.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
