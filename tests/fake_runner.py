"""A measuring function for worker tests: no GPU, with planted crashes and hangs."""
import os
import signal
import time

from gnn_policy.measure.result import Measurement


def measure(problem, configs, *, gpu, crash_on=(), hang_on=(), report_crash_on=(), calls_file=None,
            setup_fails_for=(), **_):
    if problem.m in setup_fails_for:  # what an out-of-memory reference does
        raise MemoryError(f"no room for problem {problem.key}")
    for config in configs:
        if config is None:  # cuBLAS
            if calls_file:
                with open(calls_file, "a") as f:
                    f.write("cublas\n")
            yield Measurement(gpu, problem.key, "cublas", "ok", median_ms=1.0, tflops=1.0)
            continue
        if calls_file:
            with open(calls_file, "a") as f:
                f.write(config.key + "\n")
        if config.block_m in crash_on:
            os._exit(3)  # what a faulting kernel does to its process
        if config.block_m in hang_on:
            time.sleep(3600)
        if config.block_m in report_crash_on:  # what the real runner does after a CUDA error
            yield Measurement(gpu, problem.key, config.key, "crashed", error="CUDA error: illegal address")
            continue
        yield Measurement(gpu, problem.key, config.key, "ok", median_ms=1.0, tflops=float(config.block_m))


def analytic(problem, configs, *, gpu, **_):
    """Timings from the analytic model's defaults: smooth in the knobs, without ties, so a local
    search has somewhere to climb."""
    import hardware_specs
    from gnn_policy.measure.simulator import AnalyticModel

    spec = hardware_specs.load(gpu)
    tuned = [c for c in configs if c is not None]
    ms = dict(zip(tuned, AnalyticModel().predict_ms([(problem, c, spec) for c in tuned]).tolist())) if tuned else {}
    for config in configs:
        t = ms.get(config, 0.5 * min(ms.values(), default=1.0))  # cuBLAS: twice the fastest of the batch
        yield Measurement(gpu, problem.key, config.key if config else "cublas", "ok", median_ms=t,
                          tflops=problem.flops / (t * 1e-3) / 1e12)


def slow(problem, configs, *, gpu, **options):
    """`measure` with a pause before each config ($FAKE_RUNNER_PAUSE seconds, default 0.02): a
    collection long enough for a test to interrupt it mid-problem."""
    pause = float(os.environ.get("FAKE_RUNNER_PAUSE", "0.02"))
    for config in configs:
        time.sleep(pause)
        yield from measure(problem, [config], gpu=gpu, **options)


def dying(problem, configs, *, gpu, **options):
    """`measure`, except that on the torchrun rank named by $FAKE_RUNNER_KILL_RANK this measuring
    child kills its rank (SIGKILL) when the rank's second problem arrives: a rank that dies."""
    global _problems_seen
    _problems_seen += 1
    if os.environ.get("RANK") == os.environ.get("FAKE_RUNNER_KILL_RANK") and _problems_seen == 2:
        os.kill(os.getppid(), signal.SIGKILL)
        os._exit(1)
    yield from measure(problem, configs, gpu=gpu, **options)


_problems_seen = 0  # per measuring child: one child serves a rank's problems in turn
