"""The six CUDA semantics swpipe.testing.FakeCuda models, each checked on a real GPU beside the fake: one line each.

    python benchmarks/fake_vs_real.py              # needs a CUDA device; without one it says so and exits 0
    python benchmarks/fake_vs_real.py --fake-only  # the fake's side alone (what the tests check)

Each probe runs the same few steps on the GPU (``torch.cuda``) and on the fake
(``FakeCuda``, torch ops on :class:`~swpipe.testing.FakeCudaTensor`) and reads
the same facts; a line says the facts of each and whether they agree. A
stream is held busy with a kernel that only waits (``torch.cuda._sleep`` on
the GPU; on the fake a kernel that runs until the host lets it go), so what is
"still in flight" does not depend on timing on either.

1. a non-blocking copy from pageable memory returns with the copy still in flight, the values staged;
2. ``item()`` on a stream nothing ordered after the write reads the old value (the fake also names the race);
3. another thread's ``synchronize()`` orders nothing for this thread; ``query()`` does not wait;
4. an event recorded on a second device's stream raises (needs two devices);
5. the 33rd stream drawn from a device's pool is the 1st one, and a kernel holding it holds both;
6. backward from the default stream allocates the gradient on the forward op's stream.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any, Callable, Dict, List, Optional

import torch

from swpipe.testing import FakeCuda

Facts = Dict[str, Any]
N = 1 << 16  # elements: a copy and a fill long enough to be seen, small enough for any GPU
HOLD_S = 0.2  # how long a held stream stays busy on the GPU


class _Real:
    """The GPU side: ``torch.cuda`` on device ``index``."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.device = torch.device("cuda", index)
        self._rate = self._cycles_per_s()

    def _cycles_per_s(self) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        return 10_000_000 / (start.elapsed_time(end) / 1e3)

    def stream(self) -> Any:
        return torch.cuda.Stream(device=self.index)

    def use(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def hold(self) -> Callable[[], None]:
        """Hold the current stream busy (about HOLD_S); returns what releases it (nothing to do: it ends)."""
        torch.cuda._sleep(int(self._rate * HOLD_S))
        return lambda: None

    def tensor(self, host: torch.Tensor) -> torch.Tensor:
        return host.to(self.device, non_blocking=True)

    def zeros(self) -> torch.Tensor:
        return torch.zeros(N, device=self.device)

    def event(self) -> Any:
        return torch.cuda.Event()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.index)

    def module(self, m: torch.nn.Module) -> torch.nn.Module:
        return m.to(self.device)

    def default_stream(self) -> Any:
        return torch.cuda.default_stream(self.index)

    def allocated_on(self, t: torch.Tensor, stream: Any) -> bool:
        """Whether ``t``'s memory is in a segment of ``stream``'s pool (the caching allocator's snapshot)."""
        ptr = t.data_ptr()
        for seg in torch.cuda.memory_snapshot():
            if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
                return seg["stream"] == stream.cuda_stream
        return False

    def races(self) -> Optional[int]:
        return None


class _Fake:
    """The fake side: a :class:`FakeCuda` device; the same steps on its streams and fake torch tensors."""

    def __init__(self, fake: FakeCuda, index: int = 0) -> None:
        self.fake, self.dev = fake, fake.device(index)

    def stream(self) -> Any:
        return self.dev.draw_stream()

    def use(self, stream: Any) -> Any:
        return self.dev.use(stream)

    def hold(self) -> Callable[[], None]:
        gate = threading.Event()
        self.dev.kernels.wait_host(gate)
        return gate.set

    def tensor(self, host: torch.Tensor) -> torch.Tensor:
        return self.dev.tensor(host)

    def zeros(self) -> torch.Tensor:
        return self.dev.tensor(torch.zeros(N))

    def event(self) -> Any:
        return self.dev.event()

    def synchronize(self) -> None:
        self.fake.synchronize()

    def module(self, m: torch.nn.Module) -> torch.nn.Module:
        return self.dev.module(m)

    def default_stream(self) -> Any:
        return self.dev.default_stream()

    def allocated_on(self, t: torch.Tensor, stream: Any) -> bool:
        return self.dev.stream_of(t) is stream

    def races(self) -> Optional[int]:
        return len(self.fake.races)


def _recorded(side: Any) -> Any:
    event = side.event()
    event.record()
    return event


# ----------------------------------------------------------------------------- the probes

def pageable_copy(side: Any) -> Facts:
    release = side.hold()
    host = torch.full((N,), 7.0)  # pageable
    x = side.tensor(host)
    in_flight = not _recorded(side).query()
    host.fill_(-1.0)  # after the call returned: a staged copy does not see it
    release()
    side.synchronize()
    return {"returned with the copy in flight": in_flight, "device got the staged values": bool((x == 7).all())}


def host_read(side: Any) -> Facts:
    x = side.zeros()
    side.synchronize()
    release = side.hold()
    x.fill_(1.0)  # behind the held kernel
    other = side.stream()
    with side.use(other):
        value = x[0].item()  # nothing orders this read after the fill
    release()
    side.synchronize()
    return {"item() on an unordered stream read the old value": value == 0.0}


def another_threads_sync(side: Any) -> Facts:
    x = side.zeros()
    side.synchronize()
    release = side.hold()
    x.fill_(1.0)
    done = _recorded(side)
    pending = not done.query()  # query() answers at once: the work is pending
    waiter = threading.Thread(target=done.synchronize, name="fake-vs-real-sync")
    waiter.start()  # another thread synchronises with the fill...
    other = side.stream()
    with side.use(other):
        value = x[0].item()  # ...which orders nothing for this thread's read
    release()
    waiter.join()
    side.synchronize()
    return {"query() said pending without waiting": pending,
            "a read while another thread synchronises saw the old value": value == 0.0}


def event_device(side: Any, other: Any) -> Facts:
    event = side.event()
    event.record(side.default_stream())
    try:
        event.record(other.default_stream())
    except RuntimeError as exc:
        return {"recording on another device's stream raised": str(exc).strip().splitlines()[0]}
    return {"recording on another device's stream raised": False}


def stream_pool(side: Any) -> Facts:
    drawn = [side.stream() for _ in range(33)]
    same = drawn[32] is drawn[0] or (hasattr(drawn[0], "cuda_stream") and drawn[32].cuda_stream == drawn[0].cuda_stream)
    with side.use(drawn[0]):
        release = side.hold()
    with side.use(drawn[32]):
        behind = not _recorded(side).query()
    release()
    side.synchronize()
    return {"the 33rd stream is the 1st": bool(same), "a kernel holding it holds the other": behind}


def autograd_streams(side: Any) -> Facts:
    torch.manual_seed(0)
    model = side.module(torch.nn.Linear(64, 64))
    fwd = side.stream()
    fwd.wait_stream(side.default_stream())
    with side.use(fwd):
        loss = model(side.tensor(torch.ones(32, 64))).pow(2).sum()
    loss.backward()  # from the default stream
    side.synchronize()
    return {"the gradient was allocated on the forward op's stream": side.allocated_on(model.weight.grad, fwd)}


PROBES = [("pageable non-blocking copy", pageable_copy), ("host read is a read on the current stream", host_read),
          ("observations are per thread, query() orders nothing", another_threads_sync),
          ("events belong to one device", None), ("a bounded pool of streams", stream_pool),
          ("autograd: gradients on the forward op's stream", autograd_streams)]


def fake_facts(name: str, probe: Optional[Callable]) -> Facts:
    with FakeCuda(num_devices=2, hang_timeout_s=20.0) as fake:
        if probe is None:
            facts = event_device(_Fake(fake, 0), _Fake(fake, 1))
        else:
            side = _Fake(fake)
            facts = probe(side)
            facts["races the fake named"] = side.races()
    return facts


def _real_facts(name: str, probe: Optional[Callable]) -> Facts:
    if probe is None:
        if torch.cuda.device_count() < 2:
            return {"skipped": "needs two GPUs"}
        return event_device(_Real(0), _Real(1))
    return probe(_Real(0))


def _agree(real: Facts, fake: Facts) -> str:
    if "skipped" in real:
        return "not checked"
    shared = [k for k in real if k in fake]
    return "agree" if all(real[k] == fake[k] for k in shared) else "DIFFER"


def main(argv: Optional[List[str]] = None) -> int:
    """Print one line per semantic: the real GPU's facts, the fake's, and whether they agree."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake-only", action="store_true", help="print the fake's facts only (no GPU needed)")
    args = parser.parse_args(argv)
    if not args.fake_only and not torch.cuda.is_available():
        print("fake_vs_real: skipped: no CUDA device here (it checks the fake against a real GPU; run it where one is "
              "lent, e.g. from benchmarks/gpu_session.sh, or pass --fake-only for the fake's side)")
        return 0
    if not args.fake_only:
        print(f"GPU: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, torch {torch.__version__}")
    differ = 0
    for k, (name, probe) in enumerate(PROBES, 1):
        fake = fake_facts(name, probe)
        if args.fake_only:
            print(f"{k}. {name} | fake: {fake}")
            continue
        real = _real_facts(name, probe)
        verdict = _agree(real, fake)
        differ += verdict == "DIFFER"
        print(f"{k}. {name} | real: {real} | fake: {fake} | {verdict}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
