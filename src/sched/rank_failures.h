// Ranks that stop together. In a multi-rank run every rank must issue the
// same collectives in the same order; a rank that fails on its own (out of
// memory, an I/O error, a bad call) and simply returns leaves the others
// waiting in a collective it will never join. So the engine shares every
// failure of a step's calls:
//   - a call that fails on this rank tells every other rank
//     (Communicator::Abort: the failing rank and its cause), and this
//     engine refuses every later step call with that failure;
//   - every step call first asks the communicator whether a peer stopped
//     (Communicator::Health, which never blocks), and a collective in
//     progress fails as soon as a peer's notice arrives; either way this
//     rank's calls then fail naming the rank that stopped and why;
//   - a rank that dies without a word (SIGKILL, a lost node) is found by the
//     collectives' deadline, zinf.comm_timeout_s (default 300 s), naming the
//     silent ranks.
// After a stop the engine's state may be mixed across ranks; only a Load of
// the last complete checkpoint, in a new run, continues the training.
//
// Step calls: Fetch, GradBuffers, GradsReady, Release, Step, ReportLoss
// (a NaN loss, with zinf.stop_on_nonfinite_loss), loss_scale, Synchronize,
// Stats, ReadState. Registration (AddUnit) keeps its own
// errors: nothing has been enqueued toward the peers before Finalize. Save
// and Load already agree on their outcome across the ranks (a failed Save
// fails on every rank and training may go on; a rank that cannot take part
// in that agreement stops them all); a stopped engine refuses Save.
// Thread-safety: as Engine.
#pragma once

#include <memory>

#include "common/communicator.h"
#include "zinf/engine.h"

namespace zinf::sched {

// Wraps `engine` (whose ranks talk through `comm`, size > 1; both outlive
// nothing here: the wrapper owns the engine, the caller the communicator).
std::unique_ptr<Engine> StopRanksTogether(std::unique_ptr<Engine> engine, Communicator& comm);

}  // namespace zinf::sched
