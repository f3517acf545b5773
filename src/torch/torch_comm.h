// zinf's collectives over a torch.distributed process group: the transport
// of a zinf_comm_create_transport communicator (src/cpu/transport_comm.h)
// made of a gloo ProcessGroup's operations and its Store as the board.
#pragma once

#include <torch/extension.h>

namespace zinf::torch {

// Adds create_comm(fns, group, store, rank, size, local_size, timeout) to
// the module: returns (address of a zinf_comm, "", "") or (0, status name,
// message). `fns` maps zinf_comm_create_transport and zinf_last_error and
// zinf_status_name to their addresses.
void RegisterComm(pybind11::module_& m);

}  // namespace zinf::torch
