// Fault injection for fault campaigns: one failure, at a chosen event of a
// chosen kind, in a process otherwise left alone. The plan comes from the
// environment, so a whole program (zinf train under mpirun) can be made to
// fail on one rank at one point without any change to how it is run:
//
//   ZINF_FAULT=alloc:N    the Nth device allocation fails (kOutOfMemory)
//   ZINF_FAULT=eio:N      the Nth NVMe transfer attempt fails with EIO
//   ZINF_FAULT=enospc:N   the Nth NVMe write attempt fails with ENOSPC
//   ZINF_FAULT=ring:N     the Nth io_uring submission fails hard (EIO), as a
//                         ring that broke: every block on it fails
//   ZINF_FAULT=nan:N      the Nth loss a trainer computes (zinf train's
//                         micro-steps) is NaN
//   ZINF_FAULT=count      nothing fails; at exit, the events of every kind
//                         are printed to stderr ("ZINF_FAULT counts: alloc
//                         A, read R, write W, submit S, loss L"), to choose N
//
// N counts from 1 in this process, per kind; the fault fires once, and is
// logged (warn) when it does. Unset: no site ever fails (one relaxed atomic
// load per site). Never set this in production. A malformed value is
// reported once (error) and ignored.
//
// Thread-safety: every function here may be called from any thread.
#pragma once

#include <cstdint>

namespace zinf::fault {

enum class Site : uint8_t {
  kDeviceAlloc,  // DeviceAllocator::Allocate
  kIoRead,       // an NVMe read attempt (IoEngine)
  kIoWrite,      // an NVMe write attempt
  kRingSubmit,   // an io_uring submission carrying blocks
  kLoss,         // a micro-step's loss, as a trainer computes it
};

// The errno the plan puts at this event of `site` (ENOMEM, EIO, ENOSPC; EDOM
// for a loss that becomes NaN), or 0. Counts the event.
int At(Site site);

// For tests: replaces the plan (the same syntax as ZINF_FAULT; "" clears it)
// and resets the counters. Returns false for a malformed plan.
bool SetPlanForTesting(const char* plan);

}  // namespace zinf::fault
