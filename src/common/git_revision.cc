// The build's git revision (cmake/GitRevision.cmake writes the header at
// every build; only this file recompiles when it changes). Thread-safe.
#include "common/git_revision.h"
#include "common/runtime_info.h"

namespace zinf {

std::string GitRevision() { return std::string(ZINF_GIT_REVISION) + (ZINF_GIT_DIRTY ? "+dirty" : ""); }

}  // namespace zinf
