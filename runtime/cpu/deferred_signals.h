// Asynchronous signals held back while the CPU backend's threads run oneDNN's JIT GEMM kernels.
//
// Why: the AVX-512 f32 GEMM kernel of oneDNN 2.x points the stack pointer into a heap buffer while
// it runs, so a signal handled on that thread has its handler's frame written onto the heap and
// corrupts it (oneDNN issue #4845, fixed in oneDNN 3.11.2; Debian 12 ships 2.6.3). weft handles
// SIGTERM and SIGINT (launcher/stop_signal.h): a stop request that came during a GEMM aborted the
// process in about one run in ten ("corrupted size vs. prev_size" in free, inside dnnl_sgemm).
//
// A DeferredSignals guard blocks every signal but the synchronous ones (faults, abort, traps) on the
// calling thread for its lifetime; a signal sent meanwhile stays pending and is delivered to the
// thread when the guard ends (or at once to another thread of the process that does not block it,
// none of which runs oneDNN code). Guards stand around every parallel region (parallel_for.h) and
// every GEMM called outside one (gemm.cc); OpenMP creates its worker threads inside those regions,
// so the workers inherit the blocked mask and keep it for life. Two system calls per guard.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace weft::cpu {

class DeferredSignals {
 public:
  DeferredSignals() {
    sigset_t asynchronous;
    sigfillset(&asynchronous);
    for (const int synchronous : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS}) {
      sigdelset(&asynchronous, synchronous);
    }
    pthread_sigmask(SIG_BLOCK, &asynchronous, &previous_);
  }
  ~DeferredSignals() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  DeferredSignals(const DeferredSignals&) = delete;
  DeferredSignals& operator=(const DeferredSignals&) = delete;

 private:
  sigset_t previous_;
};

}  // namespace weft::cpu
