"""Writes the synthetic nccl-tests logs in this folder (run once; the logs are committed).

The numbers come from a simple latency + bandwidth model, not from a real run: they only need the shape and
format of all_reduce_perf output (header, device list, NCCL INFO noise from several ranks, the two-part table,
the summary lines) so that the parser and the plot are exercised on what users paste.
"""

import pathlib
import random

HERE = pathlib.Path(__file__).parent

HEAD = ("#                                                              out-of-place                       in-place          \n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n")


def row(size, nranks, lat_us, peak_gbs, rnd, dtype="float", esize=4, wrong="0", sums=None):
    count = size // esize
    factor = 2 * (nranks - 1) / nranks
    vals = []
    for _ in range(2):
        eff = peak_gbs * size / (size + 4 * 1024 * 1024)
        t = lat_us + size * factor / (eff * 1e3)
        t *= 1 + rnd.uniform(-0.02, 0.02)
        alg = size / t / 1e3
        vals += [t, alg, alg * factor]
        if sums is not None:
            sums.append(alg * factor)
    return (f"{size:>12d}  {count:>12d}  {dtype:>8s}     sum      -1  {vals[0]:>7.2f}  {vals[1]:>6.2f}  {vals[2]:>6.2f}"
            f"  {wrong:>5s}  {vals[3]:>7.2f}  {vals[4]:>6.2f}  {vals[5]:>6.2f}  {wrong:>5s}")


def header(nranks, maxbytes, minbytes, hosts, gpus_per_host, model, pid0):
    out = [f"# nThread 1 nGpus 1 minBytes {minbytes} maxBytes {maxbytes} step: 2(factor) warmup iters: 5 iters: 100 "
           "agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    for r in range(nranks):
        h = hosts[r // gpus_per_host]
        d = r % gpus_per_host
        out.append(f"#  Rank {r:>2d} Group  0 Pid {pid0 + r:>6d} on {h:>12s} device {d:>2d} [0x{0x53 + 16 * d:02x}] {model}")
    return out


def efa_log():
    rnd = random.Random(5)
    hosts = ["p5-dy-gpu-1", "p5-dy-gpu-2"]
    lines = header(16, 17179869184, 8, hosts, 8, "NVIDIA H100 80GB HBM3", 40110)
    for r in (0, 9, 3):
        h = hosts[r // 8]
        lines.append(f"{h}:{40110 + r}:{40110 + r} [{r % 8}] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.16.1")
        lines.append(f"{h}:{40110 + r}:{40110 + r} [{r % 8}] NCCL INFO NET/OFI Using Libfabric version 2.1")
        lines.append(f"{h}:{40110 + r}:{40110 + r} [{r % 8}] NCCL INFO Using network Libfabric")
    lines.append("p5-dy-gpu-1:40110:40110 [0] NCCL INFO NCCL version 2.27.5+cuda12.8")
    lines.append("#")
    lines += HEAD.rstrip("\n").split("\n")
    size = 8
    i = 0
    sums = []
    while size <= 17179869184:
        r = row(size, 16, 52.0, 330.0, rnd, sums=sums)
        if i == 7:
            # Another rank's log line and this row share one line (no newline between them).
            r = "p5-dy-gpu-2:40121:40190 [3] NCCL INFO Channel 05/0 : 11[3] -> 12[4] via P2P/CUMEM" + r
        if i == 12:
            lines.append("p5-dy-gpu-2:40125:40125 [7] NCCL INFO comm 0x5581c0 rank 15 nranks 16 - Init COMPLETE")
        lines.append(r)
        size *= 2
        i += 1
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {sum(sums) / len(sums):.4f} ", "#", ""]
    return "\n".join(lines)


def ib_log():
    """srun --label output on a 2 x 4 A100 InfiniBand cluster, scanned from 128 MiB to 4 GiB."""
    rnd = random.Random(11)
    hosts = ["ggpu101", "ggpu102"]
    body = header(8, 4294967296, 134217728, hosts, 4, "NVIDIA A100-SXM4-80GB", 913400)
    body.append("ggpu101:913400:913400 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.4.11<0>")
    body.append("ggpu101:913400:913400 [0] NCCL INFO Using network IB")
    body += HEAD.rstrip("\n").split("\n")
    size = 134217728
    sums = []
    while size <= 4294967296:
        body.append(row(size, 8, 80.0, 23.5, rnd, sums=sums))
        size *= 2
    body += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {sum(sums) / len(sums):.4f} ", "#"]
    out = [f"0: {b}" for b in body]
    # Two task outputs arriving on one line, as srun -u can produce.
    out.insert(4, "1: ggpu101:913401:913401 [1] NCCL INFO cudaDriverVersion 12080")
    return "\n".join(out) + "\n"


def socket_log():
    """A job that silently fell back to sockets and validated wrong results on one size."""
    rnd = random.Random(3)
    hosts = ["n1", "n2"]
    lines = header(2, 1048576, 1024, hosts, 1, "NVIDIA A10", 5100)
    lines.append("n1:5100:5100 [0] NCCL INFO NET/Socket : Using [0]eth0:10.77.0.11<0>")
    lines.append("n1:5100:5100 [0] NCCL INFO Using network Socket")
    lines += HEAD.rstrip("\n").split("\n")
    size = 1024
    sums = []
    while size <= 1048576:
        lines.append(row(size, 2, 120.0, 1.1, rnd, wrong="3" if size == 65536 else "0", sums=sums))
        size *= 2
    lines += ["# Out of bounds values : 3 FAILED", f"# Avg bus bandwidth    : {sum(sums) / len(sums):.4f} ", "#", ""]
    return "\n".join(lines)


def no_rows_log():
    lines = header(2, 1048576, 1024, ["n1", "n2"], 1, "NVIDIA A10", 7000)
    lines.append("n1:7000:7000 [0] NCCL INFO Using network Socket")
    lines.append("n1: Test NCCL failure common.cu:1005 'unhandled system error (run with NCCL_DEBUG=INFO for details)'")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    (HERE / "all_reduce_efa_2x8.log").write_text(efa_log())
    (HERE / "all_reduce_ib_2x4_label.log").write_text(ib_log())
    (HERE / "all_reduce_socket_wrong.log").write_text(socket_log())
    (HERE / "all_reduce_failed.log").write_text(no_rows_log())
