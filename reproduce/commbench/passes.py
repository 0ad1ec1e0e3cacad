"""What the dividing snapshot saves (docs/wait-avoiding-engine.md, "The division first"): a passive round's
passes before its sum, copy then divide (the engine before it) against one copy that divides, on one thread.

    .venv/bin/python reproduce/commbench/passes.py
"""

import statistics
import time

import torch


def median_ms(fn, repeats: int = 20) -> float:
    fn()  # warm-up: the first pass page-faults the destination
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    for mb in (1, 16, 100):
        model = torch.randn(mb * 2**18)  # float32: 2**18 values per MiB
        work = torch.empty_like(model)
        two = median_ms(lambda m=model, w=work: w.copy_(m).div_(2))
        one = median_ms(lambda m=model, w=work: torch.div(m, 2, out=w))
        print(
            f"{mb} MB: copy + divide {two:.2f} ms, dividing copy {one:.2f} ms, saved {two - one:.2f} ms "
            f"({two / one:.2f}x)"
        )


if __name__ == "__main__":
    main()
