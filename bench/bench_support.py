"""What the Python benchmarks share: a caliper-server of the build on free loopback ports, and one
capture pass of a model into a session."""
import pathlib
import re
import subprocess
import time


def start_server(build: pathlib.Path, tmp: pathlib.Path, *flags: str):
    """Starts build/server/caliper-server (CPU device, logging to tmp/server.log); returns
    (process, address, metrics address) once it listens."""
    log = tmp / "server.log"
    proc = subprocess.Popen([str(pathlib.Path(build) / "server" / "caliper-server"),
                             "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                             "--device=cpu", *flags],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    for _ in range(200):
        m = re.search(r"listening on (\S+) \(metrics (\S+),", log.read_text())
        if m:
            return proc, m.group(1), m.group(2)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(log.read_text())


def capture(model, session, batches):
    """Runs `batches` through `model` (no KV cache) with the transformers hooks attached to
    `session`, then finalizes it."""
    import torch
    import caliper.hooks
    handle = caliper.hooks.attach(model, session)
    with torch.no_grad():
        for x in batches:
            model(x, use_cache=False)
    handle.detach()
    session.finalize()
