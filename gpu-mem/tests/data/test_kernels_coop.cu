// Test kernel for cooperative launches: the blocks of a grid that is resident at once meet at
// grid barriers, each block using dynamic shared memory of any size. Compiled to PTX (checked in
// as test_kernels_coop.ptx) with:
//   nvcc -ptx -arch=compute_80 -o test_kernels_coop.ptx test_kernels_coop.cu

// A grid barrier: every block adds one to `counter` and waits until it reaches the next multiple
// of the grid's size. The counter only grows, so it needs no reset between barriers or launches
// (zero it once; it wraps after 2^32 arrivals, far beyond a test).
__device__ void grid_barrier(unsigned int* counter) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
        __threadfence();
        unsigned int arrived = atomicAdd(counter, 1u);
        unsigned int target = (arrived / blocks + 1u) * blocks;
        while (*(volatile unsigned int*)counter < target) {
        }
        __threadfence();
    }
    __syncthreads();
}

// `rounds` times: block b fills words 1.. of its `shared_words` words of dynamic shared memory
// with b * 0x9E3779B1 + r * 0x85EBCA77 + i (word i, round r), sums them into word 0 (each
// thread reading words other threads wrote), publishes the sum in slots[b], meets the grid, adds
// the next block's slot to out[b], and meets the grid again before the slots change. A block
// that ran alone, or a barrier that let a block through early, leaves a wrong sum in out.
// Wrapping 32-bit arithmetic throughout. One-dimensional grid and block.
__device__ void coop_rounds_body(unsigned int* slots, unsigned int* out, unsigned int* counter,
                                 unsigned int shared_words, unsigned int rounds) {
    extern __shared__ unsigned int words[];
    const unsigned int b = blockIdx.x;
    const unsigned int blocks = gridDim.x;
    for (unsigned int r = 0; r < rounds; ++r) {
        if (threadIdx.x == 0) words[0] = 0u;
        for (unsigned int i = 1 + threadIdx.x; i < shared_words; i += blockDim.x) {
            words[i] = b * 0x9E3779B1u + r * 0x85EBCA77u + i;
        }
        __syncthreads();
        unsigned int sum = 0;
        for (unsigned int i = 1 + threadIdx.x; i < shared_words; i += blockDim.x) {
            sum += words[shared_words - i];
        }
        atomicAdd(&words[0], sum);
        __syncthreads();
        if (threadIdx.x == 0) slots[b] = words[0];
        grid_barrier(counter);
        if (threadIdx.x == 0) out[b] += *(volatile unsigned int*)&slots[(b + 1) % blocks];
        grid_barrier(counter);
    }
}

extern "C" __global__ void coop_rounds(unsigned int* slots, unsigned int* out,
                                       unsigned int* counter, unsigned int shared_words,
                                       unsigned int rounds) {
    coop_rounds_body(slots, out, counter, shared_words, rounds);
}
