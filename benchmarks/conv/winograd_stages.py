"""Stage times of the Winograd path for AlexNet C2 at batch 32 on one GPU:
    HPCLAB_BACKEND=gpu python3 benchmarks/conv/winograd_stages.py
"""
import time
import numpy as np
from hpclab import backend
backend.select()
from hpclab.halo import conv as kc, conv_winograd as wg
from hpclab.matmul import fast as mm
cuda = kc.cuda
n, c, h, k, r, pad = 32, 96, 27, 256, 5, 2
rng = np.random.default_rng(0)
x = cuda.to_device(rng.uniform(-1, 1, (n, c, h, h)).astype(np.float32))
w = rng.uniform(-0.1, 0.1, (k, c, r, r)).astype(np.float32)
wts = kc.prepare_weights(w)
out = cuda.device_array((n, k, h, h), np.float32)
m = 2; al2 = (m + r - 1) ** 2
tw = -(-h // m); tiles = n * tw * tw
v = cuda.device_array((al2, c, tiles), np.float32)
prod = cuda.device_array((al2, k, tiles), np.float32)
into, back = wg._input_kernel(m, r), wg._output_kernel(m, r)
def t(fn, reps=20):
    fn(); cuda.synchronize()
    s = time.perf_counter()
    for _ in range(reps): fn()
    cuda.synchronize()
    return (time.perf_counter() - s) / reps * 1e3
b1, t1 = wg._launch_1d(c * tiles); b2, t2 = wg._launch_1d(k * tiles)
ti = t(lambda: into[b1, t1](x, v, 0, 0, tw, tw, pad, pad))
tg = t(lambda: mm.launch_batched(wts.winograd(), v, prod))
to = t(lambda: back[b2, t2](prod, wts.bias, out, 0, 0, tw, tw, h, False))
tall = t(lambda: kc.conv2d_device(x, wts, 1, pad, out=out, method="winograd"))
def host_and_synced(fn, reps=20):
    fn(); cuda.synchronize()
    host, synced = [], []
    for _ in range(reps):
        s = time.perf_counter(); fn(); host.append(time.perf_counter() - s)
        cuda.synchronize(); synced.append(time.perf_counter() - s)
    return np.median(host) * 1e3, np.median(synced) * 1e3
hw, sw = host_and_synced(lambda: kc.conv2d_device(x, wts, 1, pad, out=out, method="winograd"))
gflop = 2 * al2 * k * c * tiles / 1e9
print(f"input transform {ti:.3f} ms, batched GEMM {tg:.3f} ms ({gflop / tg:.1f} TFLOP/s), output transform "
      f"{to:.3f} ms; a layer {tall:.3f} ms back to back, {sw:.3f} ms synchronised per call, {hw:.3f} ms on the host")
for name, kern in (("input transform", into), ("output transform", back)):
    print(f"{name}: {kern.get_regs_per_thread()} registers, {kern.get_local_mem_per_thread()} bytes of local memory per thread")
