"""Data-parallel training with te layers: examples/digits_cnn.py under
DistributedDataParallel (gloo, two processes on 127.0.0.1, started the way
torchrun starts them), each process with half of every batch, ends with the
weights of one process trained on the full batches.  Skipped without torch,
torch.distributed's gloo backend or scikit-learn."""
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
STEPS, WORLD, TIMEOUT = 3, 2, 240       # a hung process group fails the test after TIMEOUT seconds


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(tmp_path, args) -> None:
    """``examples/digits_cnn.py args`` as ranks 0..WORLD-1 of one process
    group, with the environment torchrun gives them; fails on a non-zero exit
    or when the group does not finish within TIMEOUT seconds."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(WORLD),
               TE_NUM_THREADS="1", OMP_NUM_THREADS="1")      # one core per process
    logs = [tmp_path / f"rank{r}.log" for r in range(WORLD)]
    procs = []
    for r, log in enumerate(logs):
        with log.open("w") as out:          # the child keeps its own copy of the file
            procs.append(subprocess.Popen([sys.executable, str(EXAMPLES / "digits_cnn.py"), *args],
                                          env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                          stdout=out, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + TIMEOUT
    try:
        for p in procs:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the process group did not finish in {TIMEOUT} s; rank 0 printed:\n{logs[0].read_text()[-3000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{log.read_text()[-3000:]}"


def test_ddp_on_two_processes_matches_one_process_on_full_batches(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import digits_cnn as net
    saved = tmp_path / "ddp.pt"
    run_ranks(tmp_path, ["--steps", str(STEPS), "--float64", "--save", str(saved)])
    got = torch.load(saved)

    x, y, _, _ = net.load_data(torch.float64)
    model = net.TeNet(torch.float64)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    losses = net.fit(model, x, y, steps=STEPS)
    assert len(losses) == STEPS
    want = model.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert (want[name] - start[name]).abs().max() > 1e-4, f"{name} barely moved: the comparison would be empty"
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-14, msg=lambda m: f"{name}: {m}")
