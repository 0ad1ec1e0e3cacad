"""A passive round's passes before the sum: copy then divide (the engine of 734b100) against a copy that divides."""
import statistics, time, torch
torch.set_num_threads(1)
for mb in (1, 16, 100):
    m = torch.randn(mb * 2**18); w = torch.empty_like(m)
    a, b = [], []
    for _ in range(21):
        t0 = time.perf_counter(); w.copy_(m); w.div_(2); a.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); torch.div(m, 2, out=w); b.append(time.perf_counter() - t0)
    ma, mb_ = statistics.median(a[1:]), statistics.median(b[1:])
    print(f"{mb} MB: copy + divide {1e3*ma:.2f} ms, dividing copy {1e3*mb_:.2f} ms, saved {1e3*(ma-mb_):.2f} ms ({ma/mb_:.2f}x)")
