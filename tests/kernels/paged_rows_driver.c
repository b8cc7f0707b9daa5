/* Runs core/kernels/paged_rows.c on one problem read from stdin and writes the output to stdout, so a build for
   another architecture (NEON, under qemu-user) can be checked against the float64 reference in Python
   (tests/kernels/test_cpu_isa_cross.py). Compile with -DKERNEL='"path/to/paged_rows.c"'.

   stdin: 9 int64 (S, KV, R, D, BS, dtype, table_stride, window, num_blocks), 1 float32 scale, then
   q [S, KV, R, D], k and v caches [num_blocks, BS, KV, D] (dtype elements: 4 bytes float32, 2 bytes bfloat16 /
   float16), table [S, table_stride] int64, row_pos [S, R] int64, all contiguous.
   stdout: out [S, KV, R, D] float32. stderr: the ISA the kernel was built for. Exit status 0, or 1 on a short
   read / failed allocation / kernel error. */
#include <stdio.h>
#include KERNEL

static void *read_all(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (p && fread(p, 1, bytes, stdin) != bytes) { free(p); return NULL; }
    return p;
}

int main(void) {
    int64_t h[9];
    float scale;
    if (fread(h, sizeof h, 1, stdin) != 1 || fread(&scale, sizeof scale, 1, stdin) != 1) return 1;
    const int64_t S = h[0], KV = h[1], R = h[2], D = h[3], BS = h[4], ts = h[6], window = h[7], nb = h[8];
    const int dtype = (int)h[5];
    const size_t es = dtype == DT_F32 ? 4 : 2;
    void *q = read_all(es * S * KV * R * D), *k = read_all(es * nb * BS * KV * D), *v = read_all(es * nb * BS * KV * D);
    int64_t *table = read_all(sizeof(int64_t) * S * ts), *pos = read_all(sizeof(int64_t) * S * R);
    float *out = malloc(sizeof(float) * S * KV * R * D);
    if (!q || !k || !v || !table || !pos || !out) return 1;
    int64_t tiles[4];
    fprintf(stderr, "%s\n", paged_rows_isa(tiles));
    int64_t split = 1;
    while (split < KV && S * split < 4) split++;
    if (paged_rows(q, KV * R * D, R * D, D, k, BS * KV * D, KV * D, D, v, BS * KV * D, KV * D, D, table, ts, pos, out,
                   S, KV, R, D, BS, scale, dtype, 2, split, window) != 0)
        return 1;
    return fwrite(out, sizeof(float), (size_t)(S * KV * R * D), stdout) == (size_t)(S * KV * R * D) ? 0 : 1;
}
