"""Where the server listens: the loopback rule, the socket, a server on a background thread; and
how many cores the models' arithmetic takes.

`attnlab serve` binds 127.0.0.1 unless told otherwise, and refuses to listen beyond this machine
without an API key. The socket is bound before the application starts, so a port in use is one
clear line (not a log record after the models loaded), and port 0 gets a free port whose number
is printed.
"""

import ipaddress
import socket
import threading
import time

import torch

from attnlab.errors import UserError


def model_threads(cores: int | None = None) -> int:
    """Torch threads for the models of a server: the cores torch would use (OMP_NUM_THREADS where
    set), less one, at least one.

    The core left over is the event loop's, which turns every token into an SSE event. Given all
    the cores, PyTorch's thread pool contends with the loop (and with local clients) for them, and
    its threads wait on one another at every small operator, batched or one request at a time
    (measured in BENCHMARKS.md, "Why one thread")."""
    return max(1, (torch.get_num_threads() if cores is None else cores) - 1)


def is_loopback(host: str) -> bool:
    """Whether `host` is an address of this machine only: "localhost", 127.0.0.0/8, ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_exposure(host: str, api_key: str | None) -> None:
    """A `UserError` for a non-loopback `host` without an API key: anyone on the network could use the models."""
    if not is_loopback(host) and not api_key:
        raise UserError(
            f"--host {host} listens beyond this machine: give an --api-key KEY (or set ATTNLAB_API_KEY), "
            "or keep the default --host 127.0.0.1"
        )


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`:`port` (0: a free port); a `UserError` when that fails."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"--host {host} is not an address of this machine ({e.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port or --host") from None
    sock.set_inheritable(True)
    return sock


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class BackgroundServer:
    """A uvicorn server for `app` on a thread of this process, listening on 127.0.0.1 (a free port
    by default): for tests, notebooks and benchmarks that need a real HTTP server beside their code.

        with BackgroundServer(app) as server:
            httpx.get(server.url + "/healthz")
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.app = app
        self.sock = bind(host, port)
        self.url = url(self.sock)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *_) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
