/* zinf.h: the C ABI of libzinf, for trainers and frameworks that link zinf as
 * their offload backend from C, C++, Python (ctypes) or any C FFI.
 *
 * Three independent parts:
 *   - the engine (zinf_engine_*): ZeRO partitioning, gradient accumulation
 *     and mixed-precision Adam/AdamW, driven per micro-step with fetch /
 *     grad buffers / grads ready / release / step, as the C++ zinf::Engine
 *     (include/zinf/engine.h documents the protocol and the numerics);
 *   - the asynchronous I/O handle (zinf_aio_*): pread/pwrite on io_uring with
 *     a thread-pool fallback, what DeepSpeed exposes as its aio handle;
 *   - the CPU Adam (zinf_adam_*) over caller buffers, what DeepSpeed exposes
 *     as DeepSpeedCPUAdam.
 *
 * Conventions, for every function below unless its comment says otherwise:
 *   - It returns a zinf_status: ZINF_OK (0) or one of the ZINF_ERR_* codes.
 *     On failure zinf_last_error() gives the reason as text, and the outputs
 *     are left untouched unless the function's comment says otherwise.
 *   - Handles are opaque. Whoever gets a handle from a *_create / *_open
 *     function owns it and gives it back with the matching *_destroy / _close
 *     / _free, which accept NULL. Passing a handle after that is undefined.
 *   - A NULL handle or NULL output pointer is ZINF_ERR_INVALID_ARGUMENT.
 *   - Nothing throws: no C++ exception crosses this boundary. A C++ exception
 *     inside zinf becomes ZINF_ERR_INTERNAL (ZINF_ERR_OUT_OF_MEMORY for
 *     std::bad_alloc). A broken internal invariant (a bug) aborts with
 *     file:line, as everywhere in zinf.
 *   - Sizes are in bytes when the name says bytes, else in elements.
 *   - Thread-safety is stated per group; "any thread" means the function may
 *     be called concurrently with any other function of this header.
 *
 * Only the functions declared here are exported from libzinf.so; the C++
 * classes of the other include/zinf/ headers are for code built inside the
 * zinf tree (their symbols are hidden in the shared library). The ABI version
 * is the shared library's SONAME (libzinf.so.<ZINF_ABI_VERSION>); any change
 * to a function signature, an enum value or a struct layout here bumps it.
 * This header includes only <stddef.h> and <stdint.h>: no CUDA, NCCL,
 * liburing, MPI or C++ header is needed to compile against it. */
#ifndef ZINF_ZINF_H_
#define ZINF_ZINF_H_

#include <stddef.h>
#include <stdint.h>

#define ZINF_ABI_VERSION 0
#define ZINF_VERSION_MAJOR 0
#define ZINF_VERSION_MINOR 1
#define ZINF_VERSION_PATCH 0

#if defined(ZINF_BUILDING_CAPI) && defined(__GNUC__)
#define ZINF_API __attribute__((visibility("default")))
#else
#define ZINF_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status codes, errors, library ----------------------------------------
 * The codes mirror zinf::StatusCode (include/zinf/status.h) value for value.
 * Thread-safety: every function of this group may be called from any thread. */
typedef enum zinf_status {
  ZINF_OK = 0,
  ZINF_ERR_INVALID_ARGUMENT = 1, /* the caller passed something wrong */
  ZINF_ERR_NOT_FOUND = 2,        /* a named thing (a file) does not exist */
  ZINF_ERR_ALREADY_EXISTS = 3,
  ZINF_ERR_FAILED_PRECONDITION = 4, /* valid call, wrong state (e.g. add_unit after fetch) */
  ZINF_ERR_OUT_OF_RANGE = 5,
  ZINF_ERR_UNIMPLEMENTED = 6, /* not in this build or not yet (e.g. the engine on CUDA) */
  ZINF_ERR_IO = 7,            /* an OS I/O call failed: the message names op, path, offset, length, errno */
  ZINF_ERR_DATA_LOSS = 8,     /* bytes missing or corrupt (short file, checksum) */
  ZINF_ERR_OUT_OF_MEMORY = 9, /* a budget or an allocator said no */
  ZINF_ERR_UNAVAILABLE = 10,  /* a peer or device is not there (dead rank, no GPU) */
  ZINF_ERR_INTERNAL = 11      /* a bug in zinf, or an exception caught at this boundary */
} zinf_status;

/* The message of the last failed call on the calling thread, "" when the
 * last call that returns a zinf_status succeeded: each of those clears it on
 * entry (the functions returning void, a pointer or a plain value leave it
 * alone). Thread-local; the pointer stays valid until the calling thread's
 * next call of a function returning a zinf_status. Never NULL. */
ZINF_API const char* zinf_last_error(void);

/* "OK", "InvalidArgument", "IoError", ...; "Unknown" for other values.
 * Static storage; never NULL. */
ZINF_API const char* zinf_status_name(int code);

/* The library's version, "0.1.0" (static storage), and its ABI version (the
 * SONAME number). A program may compare zinf_abi_version() with the
 * ZINF_ABI_VERSION it was compiled with. */
ZINF_API const char* zinf_version(void);
ZINF_API int zinf_abi_version(void);

/* Sets the level of zinf's logger (stderr): "trace", "debug", "info",
 * "warn", "error" or "off" (default: $ZINF_LOG_LEVEL, else "info").
 * Errors: ZINF_ERR_INVALID_ARGUMENT for NULL or another name. */
ZINF_API int zinf_set_log_level(const char* level);

/* Frees a string zinf returned through a `char** out` (zinf_engine_stats_json,
 * zinf_engine_config_json). NULL is a no-op. */
ZINF_API void zinf_string_free(char* str);

/* The CPU time a thread spends inside zinf's calls, for a front-end that
 * measures its own host overhead apart from the library's (its hooks'
 * Python, say). zinf_call_cpu_accounting(1) starts counting, process-wide,
 * every call that returns a zinf_status (each then reads the thread's CPU
 * clock twice); 0 stops. zinf_thread_call_cpu_seconds() is what the calling
 * thread has spent inside counted calls so far: CPU time, so that waiting on
 * a stream costs nothing. Thread-safe. */
ZINF_API void zinf_call_cpu_accounting(int enable);
ZINF_API double zinf_thread_call_cpu_seconds(void);

/* Element types, mirroring zinf::DType. */
typedef enum zinf_dtype {
  ZINF_DTYPE_FP32 = 0, /* IEEE binary32 */
  ZINF_DTYPE_BF16 = 1, /* bfloat16 (uint16_t storage) */
  ZINF_DTYPE_FP16 = 2  /* IEEE binary16 (uint16_t storage) */
} zinf_dtype;

/* ---- Communicators ---------------------------------------------------------
 * Where the engine's ranks come from. Creating one is collective over the
 * ranks it joins (each rank calls it) and blocks until they have joined.
 * Thread-safety: create/destroy from one thread; the rank/size queries from
 * any thread. A communicator must outlive every engine created with it. */
typedef struct zinf_comm zinf_comm;

/* The ranks of the MPI world (Open MPI's mpirun; MPI is initialized here
 * unless the caller did), or — in a process not started by an MPI launcher —
 * a 1-rank communicator that never calls MPI. A collective that makes no
 * progress for `timeout_seconds` (<= 0: 300) fails with ZINF_ERR_UNAVAILABLE
 * naming the silent ranks.
 * Errors: ZINF_ERR_FAILED_PRECONDITION (MPI initialized by the caller below
 * MPI_THREAD_SERIALIZED, or finalized), ZINF_ERR_UNAVAILABLE. */
ZINF_API int zinf_comm_create_mpi(double timeout_seconds, zinf_comm** out);

/* NCCL_UNIQUE_ID_BYTES: the size of an ncclUniqueId. */
#define ZINF_NCCL_UNIQUE_ID_BYTES 128

/* ncclGetUniqueId into `out` (`bytes` must be ZINF_NCCL_UNIQUE_ID_BYTES):
 * call on one rank and hand the bytes to every rank (e.g. through a store).
 * Errors: ZINF_ERR_UNIMPLEMENTED in a build without NCCL; ZINF_ERR_INVALID_ARGUMENT
 * for a wrong size; NCCL's failures as ZINF_ERR_UNAVAILABLE/INTERNAL. */
ZINF_API int zinf_nccl_get_unique_id(void* out, size_t bytes);

/* ncclCommInitRank for rank `rank` of `world_size` with a caller-supplied
 * unique id on CUDA device ordinal `cuda_device`. Blocks until every rank
 * joined. Errors: as zinf_nccl_get_unique_id, and ZINF_ERR_UNAVAILABLE without
 * a usable GPU. */
ZINF_API int zinf_comm_create_nccl(int rank, int world_size, const void* unique_id, size_t unique_id_bytes,
                                   int cuda_device, zinf_comm** out);

/* Wraps the caller's existing ncclComm_t (passed as void*), e.g. the one
 * torch.distributed made. The caller keeps ownership: it must outlive the
 * zinf_comm and every engine using it, and zinf never destroys it.
 * Errors: ZINF_ERR_UNIMPLEMENTED in a build without NCCL. */
ZINF_API int zinf_comm_wrap_nccl(void* nccl_comm, zinf_comm** out);

/* A communicator over collectives another runtime already runs for the job
 * (zinf.torch: a gloo process group of torch.distributed, under torchrun,
 * the deepspeed launcher, accelerate launch or srun), for engines on the
 * CPU device. zinf keeps its own contract on top: collectives numbered and
 * started in the same order on every rank, the rank-order reduction (the
 * same bits as zinf_comm_create_mpi's), deadlines and failure notices
 * naming the rank (src/cpu/transport_comm.h). The caller supplies:
 *   rank, size, local_size: this process's place (local_size: ranks on this
 *     machine, which per-rank thread defaults divide the machine by);
 *   start: begins operation `op` (ZINF_TRANSPORT_*) and returns at once with
 *     a handle in *out_handle; 0, or -1 with the reason in `error` (at most
 *     error_bytes, NUL-terminated). ALL_GATHER: `bytes` from send, size*bytes
 *     into recv (rank r's at r*bytes; send may be recv + rank*bytes);
 *     ALL_TO_ALL: size*bytes each way, send's chunk p to rank p, rank p's
 *     chunk at recv + p*bytes; BROADCAST: `bytes` of rank root's recv into
 *     every rank's recv; BARRIER: no buffers;
 *   test: 1 done, 0 not yet, -1 failed (reason in `error`); never blocks;
 *   release: ends a handle, done or not (not done: the operation may still
 *     use its buffers; zinf keeps them);
 *   post / read: a board every rank sees (a store): post sets `key` to
 *     `value`; read copies the value of `key` into `value` (at most
 *     value_bytes; the full length in *out_bytes) and returns 1, 0 when there
 *     is no such key yet, -1 on failure; read never blocks;
 *   destroy: called once when the communicator is destroyed (may be NULL).
 * Every function may be called from any of zinf's threads, start from one at
 * a time. On success zinf owns `ctx` (destroy); on failure the caller keeps
 * it. A collective that makes no progress for `timeout_seconds` (<= 0: 300)
 * fails with ZINF_ERR_UNAVAILABLE naming the silent ranks.
 * Thread-safety: as the other create functions. */
typedef enum {
  ZINF_TRANSPORT_ALL_GATHER = 0,
  ZINF_TRANSPORT_ALL_TO_ALL = 1,
  ZINF_TRANSPORT_BROADCAST = 2,
  ZINF_TRANSPORT_BARRIER = 3
} zinf_transport_op;

typedef struct zinf_transport {
  void* ctx;
  int rank;
  int size;
  int local_size;
  int (*start)(void* ctx, int op, const void* send, void* recv, size_t bytes, int root, void** out_handle, char* error,
               size_t error_bytes);
  int (*test)(void* ctx, void* handle, char* error, size_t error_bytes);
  void (*release)(void* ctx, void* handle);
  int (*post)(void* ctx, const char* key, const char* value, size_t value_bytes, char* error, size_t error_bytes);
  int (*read)(void* ctx, const char* key, char* value, size_t value_bytes, size_t* out_bytes, char* error,
              size_t error_bytes);
  void (*destroy)(void* ctx);
} zinf_transport;

ZINF_API int zinf_comm_create_transport(const zinf_transport* transport, double timeout_seconds, zinf_comm** out);

/* This process's rank and the number of ranks. */
ZINF_API int zinf_comm_rank(const zinf_comm* comm, int* out_rank);
ZINF_API int zinf_comm_size(const zinf_comm* comm, int* out_size);

/* Destroys the communicator (not a wrapped ncclComm_t). NULL is a no-op. */
ZINF_API void zinf_comm_destroy(zinf_comm* comm);

/* ---- Engine ----------------------------------------------------------------
 * One engine per model. Its device is chosen by the config's "zinf" block
 * ("device": auto | cpu | cuda | cuda:N, "device_memory": budget in bytes).
 * On "cpu" the host stands in for the accelerator: a stream is a worker
 * thread, device memory a budgeted host arena, and a device pointer is a
 * plain host address. On a CUDA GPU pointers are device memory and a stream
 * is a cudaStream_t (zinf_stream_native_handle; zinf_stream_adopt takes a
 * framework's own).
 *
 * Per micro-step, for each unit (see include/zinf/engine.h):
 *   zinf_engine_fetch(u, s)        pointers to u's compute copy, valid for work
 *                                  enqueued on s afterwards;
 *   zinf_engine_grad_buffers(u)    where backward writes u's fp32 gradients;
 *   zinf_engine_grads_ready(u, s)  after backward's writes on s;
 *   zinf_engine_release(u, s)      after the last use of u's parameters on s;
 *   zinf_engine_step()             once per micro-step, after every unit's
 *                                  grads_ready (runs the optimizer at the
 *                                  accumulation boundary, asynchronously).
 * These never block the host. Work that reads or writes the buffers must run
 * in the order of stream s: enqueue it with zinf_stream_enqueue_host (or, on
 * a CUDA device, launch it on zinf_stream_native_handle(s)), or call
 * zinf_stream_synchronize(s) after the fetch and compute on the calling
 * thread before the next call on s.
 *
 * Thread-safety: one thread drives an engine (every zinf_engine_* call on it
 * from that thread, or serialized by the caller); its streams may be used
 * from any thread. Every rank must make the same calls in the same order. */
typedef struct zinf_engine zinf_engine;
typedef struct zinf_stream zinf_stream;

/* Creates an engine from a DeepSpeed-style JSON config (text, or a file's
 * path). `comm` NULL means one rank; otherwise it gives rank and world size
 * and must outlive the engine. The caller owns *out.
 * Errors: ZINF_ERR_INVALID_ARGUMENT for a config error (the message names the
 * JSON key path, what was found and what is accepted); ZINF_ERR_NOT_FOUND /
 * ZINF_ERR_IO for an unreadable file; ZINF_ERR_UNIMPLEMENTED for an option
 * or device the engine cannot honour; ZINF_ERR_OUT_OF_MEMORY when the device
 * budget cannot be reserved. */
ZINF_API int zinf_engine_create(const char* config_json, zinf_comm* comm, zinf_engine** out);

/* Replaces every "auto" value of a DeepSpeed config as Hugging Face's
 * DeepSpeed integration does, from `context_json` (may be NULL): a JSON
 * object with any of hidden_size (reduce_bucket_size = h*h,
 * stage3_prefetch_bucket_size = 0.9*h*h, stage3_param_persistence_threshold
 * = 10*h), lr, weight_decay, micro_batch_size, gradient_accumulation_steps,
 * gradient_clipping, total_num_steps, warmup_num_steps, world_size.
 * *out_config_json receives the resolved config (free with
 * zinf_string_free); *out_notes (may be NULL) one "key = value (why)" line
 * per value resolved. A key that cannot be resolved from what is given is
 * ZINF_ERR_INVALID_ARGUMENT naming it. zinf_engine_create refuses a config
 * that still holds "auto", naming the keys. */
ZINF_API int zinf_config_resolve_auto(const char* config_json, const char* context_json, char** out_config_json,
                                      char** out_notes);
ZINF_API int zinf_engine_create_from_file(const char* config_path, zinf_comm* comm, zinf_engine** out);

/* Waits for everything the engine enqueued, then frees it and its device
 * memory. Every stream's work that uses the engine's buffers must be finished
 * (zinf_stream_synchronize) before. Streams of the engine may outlive it.
 * NULL is a no-op. */
ZINF_API void zinf_engine_destroy(zinf_engine* engine);

/* The effective configuration (every key, defaults filled in) as JSON; free
 * with zinf_string_free. */
ZINF_API int zinf_engine_config_json(const zinf_engine* engine, char** out_json);

typedef struct zinf_engine_info {
  int rank;
  int world_size;
  int zero_stage;
  int num_units;
  zinf_dtype compute_dtype;            /* the compute copy's type (bf16, fp16 or fp32) */
  int64_t gradient_accumulation_steps; /* micro-steps per optimizer step */
} zinf_engine_info;
ZINF_API int zinf_engine_get_info(const zinf_engine* engine, zinf_engine_info* out);

/* Where the host addresses the engine's whole device memory as it is: on
 * the CPU device (outside checking mode) every pointer the engine hands out
 * (zinf_engine_fetch, zinf_engine_grad_buffers) lies in
 * [*out_base, *out_base + *out_bytes), so a front-end can make one tensor
 * over it and take each parameter as a view at its offset. *out_base NULL
 * and *out_bytes 0 where it does not (a GPU). Thread-safety: any thread. */
ZINF_API int zinf_engine_host_memory(const zinf_engine* engine, void** out_base, uint64_t* out_bytes);

/* One parameter tensor of a unit. `init` is host memory holding
 * product(shape) elements of `dtype` (NULL: zeros); every rank must pass the
 * same values. zinf copies what it needs before returning. */
typedef struct zinf_param_spec {
  const char* name;
  const int64_t* shape; /* ndim extents, each > 0 */
  size_t ndim;
  zinf_dtype dtype; /* of init */
  const void* init;
} zinf_param_spec;

/* Registers a unit of `num_params` tensors (a layer); *out_unit receives its
 * index (0, 1, ... in call order; may be NULL). Only before the first fetch.
 * Errors: ZINF_ERR_INVALID_ARGUMENT (empty unit, bad shape or dtype),
 * ZINF_ERR_FAILED_PRECONDITION (after the first fetch), ZINF_ERR_OUT_OF_MEMORY. */
ZINF_API int zinf_engine_add_unit(zinf_engine* engine, const char* name, const zinf_param_spec* params,
                                  size_t num_params, int* out_unit);

/* Parameter groups: hyper-parameters of a set of tensors that differ from the
 * config's optimizer.params, as torch's param_groups carry them (HF Trainer:
 * no weight decay on biases and norm weights). Group 0 is the config's.
 * zinf_engine_add_param_group defines one (only before the first fetch) with
 * its weight decay and its own lr (lr < 0: the schedule's); *out_group
 * (may be NULL) receives its index (1, 2, ...). zinf_engine_set_group_lr sets
 * a group's lr for the optimizer steps enqueued from then on (< 0: the
 * schedule's again); a trainer that drives the lr itself (a torch lr
 * scheduler) calls it before each accumulation boundary. Every rank sets the
 * same. Errors: ZINF_ERR_INVALID_ARGUMENT (unknown group, negative or
 * non-finite weight decay, non-finite lr), ZINF_ERR_FAILED_PRECONDITION. */
ZINF_API int zinf_engine_add_param_group(zinf_engine* engine, double weight_decay, double lr, int* out_group);

/* The lr the config's schedule (or optimizer.params.lr) gives the optimizer
 * step that follows `completed_steps` applied steps, as DeepSpeed's engine
 * applies its schedulers: what the next step will use. */
ZINF_API int zinf_engine_scheduled_lr(const zinf_engine* engine, int64_t completed_steps, double* out_lr);
ZINF_API int zinf_engine_set_group_lr(zinf_engine* engine, int group, double lr);

/* zinf_engine_add_unit with each tensor's parameter group (`groups`:
 * num_params entries, or NULL for group 0) and flags: ZINF_UNIT_FROZEN
 * registers parameters that do not train (requires_grad false): the unit keeps
 * only its compute copy, on the tier and partition the config gives
 * parameters, with no gradients or optimizer state; it is fetched and
 * released like any unit and has no grad_buffers or grads_ready. Its value
 * (read_state, checkpoints) is its compute copy. */
#define ZINF_UNIT_FROZEN 1
ZINF_API int zinf_engine_add_unit_ex(zinf_engine* engine, const char* name, const zinf_param_spec* params,
                                     size_t num_params, const int* groups, int flags, int* out_unit);

/* A unit's buffers on the device: its tensors packed back to back in
 * registration order, then zero padding. `tensors` (num_tensors pointers into
 * `data`) is owned by the engine and stays as returned until the engine is
 * destroyed: a later fetch that gathers the unit at another address returns
 * another array. */
typedef struct zinf_unit_pointers {
  void* data;
  zinf_dtype dtype;
  int64_t num_elems; /* sum of the tensors' elements */
  void* const* tensors;
  size_t num_tensors;
} zinf_unit_pointers;

/* The unit's compute copy (compute_dtype), valid for work enqueued on
 * `stream` after this call, until zinf_engine_release(unit, stream). The
 * stream waits for the unit's last update; the host does not.
 * Errors: ZINF_ERR_INVALID_ARGUMENT (no such unit, stream of another device). */
ZINF_API int zinf_engine_fetch(zinf_engine* engine, int unit, zinf_stream* stream, zinf_unit_pointers* out);

/* Where backward writes the unit's gradients: fp32, overwritten each
 * micro-step (the engine accumulates), writable by work enqueued after the
 * unit's fetch on the same stream. With ZeRO stage 3 a partitioned unit's
 * buffer exists only from this call to its reduction after
 * zinf_engine_grads_ready: call it in each micro-step, after or just before
 * the unit's backward fetch; grads_ready without it means zero gradients. */
ZINF_API int zinf_engine_grad_buffers(zinf_engine* engine, int unit, zinf_unit_pointers* out);

/* Backward's writes to the unit's gradients were enqueued on `stream`. */
ZINF_API int zinf_engine_grads_ready(zinf_engine* engine, int unit, zinf_stream* stream);

/* The last use of the unit's parameters was enqueued on `stream`. */
ZINF_API int zinf_engine_release(zinf_engine* engine, int unit, zinf_stream* stream);

/* Ends a micro-step. *out_boundary (may be NULL) is 1 when this was an
 * accumulation boundary and the optimizer step was enqueued, else 0.
 * Errors: ZINF_ERR_FAILED_PRECONDITION (a unit without grads_ready), and any
 * error of earlier asynchronous work (I/O, collectives). */
ZINF_API int zinf_engine_step(zinf_engine* engine, int* out_boundary);

/* This micro-step's loss (before the loss scale), before zinf_engine_step.
 * With the config's zinf.stop_on_nonfinite_loss, a NaN or infinite loss
 * fails with ZINF_ERR_FAILED_PRECONDITION and the engine takes no further
 * steps (with several ranks, every rank stops, naming this one); resume
 * from the last complete checkpoint. Otherwise it checks the engine's
 * health only. The value is a host number: on a GPU, copying it back waits
 * for the forward, so report it only when the check is wanted. */
ZINF_API int zinf_engine_report_loss(zinf_engine* engine, double loss);

/* The caller's work on the engine's timeline (the `timeline` of
 * zinf_engine_stats_json): zinf_engine_trace_begin records a timing event
 * on `stream` and returns a token; zinf_engine_trace_end records another
 * after the work the caller enqueued on `stream` in between, and adds that
 * span to the step in `lane` ("compute" for the model's work) named
 * `what`. No host code runs on the stream. Before the first fetch the
 * token is 0 and the span is not timed. Errors:
 * ZINF_ERR_INVALID_ARGUMENT (a token that is not open, a NULL lane or
 * what), ZINF_ERR_FAILED_PRECONDITION (4096 traces open). */
ZINF_API int zinf_engine_trace_begin(zinf_engine* engine, zinf_stream* stream, int64_t* out_token);
ZINF_API int zinf_engine_trace_end(zinf_engine* engine, zinf_stream* stream, int64_t token, const char* lane,
                                   const char* what);

/* The factor backward multiplies the loss by: fp16's dynamic loss scale
 * (blocks for the previous step's overflow decision), else 1. */
ZINF_API int zinf_engine_loss_scale(zinf_engine* engine, float* out_scale);

/* Blocks until everything the engine enqueued has run; returns the first error. */
ZINF_API int zinf_engine_synchronize(zinf_engine* engine);

/* The metrics of the latest accumulation boundary whose step has finished,
 * as one JSON object, without waiting for the device (it waits only for the
 * first step; call zinf_engine_synchronize first for the step just
 * enqueued): step, boundary, behind (boundaries enqueued since that have
 * not finished), skipped, loss_scale,
 * next_loss_scale, lr, grad_norm, clip_coef, optimizer_seconds,
 * comm_seconds, copy_seconds, io_seconds, stall_seconds, longest_stall,
 * nvme_bytes_read, nvme_bytes_written (and their _total since the engine
 * started), copy_bytes (host<->device), collectives
 * [{kind, calls, bytes}], device_bytes_in_use, summary (the one-line log
 * form), timeline [{lane, what, start, end}] (seconds since the engine's
 * first fetch: the step's work, its updates, waits, disk, copies and
 * collectives, and the caller's traced work; see zinf/engine.h's
 * TimelineSpan) and timeline_dropped. A non-finite number is written as a
 * string ("inf", "nan").
 * Free *out_json with zinf_string_free. */
ZINF_API int zinf_engine_stats_json(zinf_engine* engine, char** out_json);

typedef enum zinf_state_kind {
  ZINF_STATE_MASTER = 0,        /* fp32 master parameters */
  ZINF_STATE_EXP_AVG = 1,       /* Adam m */
  ZINF_STATE_EXP_AVG_SQ = 2,    /* Adam v */
  ZINF_STATE_COMPUTE_PARAMS = 3 /* the compute copy, widened to fp32 */
} zinf_state_kind;

/* Copies the whole unit's state, widened to fp32, into host memory:
 * `num_elems` must be the unit's num_elems. Blocks. Collective in ZeRO
 * stages 1 and 2 (the shards are gathered): every rank calls it. */
ZINF_API int zinf_engine_read_state(zinf_engine* engine, int unit, zinf_state_kind kind, float* host_dst,
                                    size_t num_elems);

/* Sets the whole unit's parameters from fp32 host memory (`num_elems` must
 * be the unit's; every rank passes the same values): the fp32 master and the
 * compute copy (its rounding). Adam's m and v and the step counts are kept.
 * Between optimizer steps only; kind must be ZINF_STATE_MASTER. Blocks. */
ZINF_API int zinf_engine_write_state(zinf_engine* engine, int unit, zinf_state_kind kind, const float* host_src,
                                     size_t num_elems);

/* Copies `bytes` of host memory from rank `root`'s `host` into every other
 * rank's, through the engine's communicator, once everything the engine
 * enqueued has run. Collective: every rank calls with the same `bytes` and
 * `root`; between optimizer steps only. Returns on every rank only once
 * every rank has joined: with `bytes` 0 (host may then be NULL) it is a
 * barrier. Blocks. */
ZINF_API int zinf_engine_broadcast(zinf_engine* engine, void* host, size_t bytes, int root);

/* ---- Checkpoints -----------------------------------------------------------
 * Between optimizer steps only (after a zinf_engine_step that reported an
 * accumulation boundary, or before the first); collective: every rank of the
 * engine calls, with the same arguments. */

/* Saves the engine's state under `dir` (created if missing) as
 * `dir`/step-N/ and points `dir`/latest at it, atomically: every rank writes
 * its shard of each unit's fp32 master, m and v with an XXH3 checksum per
 * slice, rank 0 writes the manifest (format, config, world size, stage, step
 * counters, loss-scale state, `client_json`), fsyncs and renames. A crash at
 * any moment leaves the previous checkpoint intact. `client_json` is the
 * caller's own state to keep with it (a JSON value; NULL means {}), returned
 * by zinf_engine_load. *out_path (may be NULL) receives the checkpoint's
 * directory; free it with zinf_string_free.
 * Errors: INVALID_ARGUMENT (client_json not JSON), FAILED_PRECONDITION (in
 * the middle of an accumulation), IO (names the path, offset, length and
 * errno; ENOSPC included), UNAVAILABLE (a rank failed). */
ZINF_API int zinf_engine_save(zinf_engine* engine, const char* dir, const char* client_json, char** out_path);

/* Restores a checkpoint written by zinf_engine_save: `path` is a step-N
 * directory or the `dir` holding `latest`. The engine's units must be
 * registered as they were when saving (names and sizes); the stage, offload
 * tier and world size may differ (the state is resharded). Every checksum is
 * verified before anything is used. *out_client_json (may be NULL) receives
 * the saved client JSON; free it with zinf_string_free.
 * Errors: NOT_FOUND (no checkpoint there), DATA_LOSS (checksum mismatch,
 * truncated file: names the tensor and the file), INVALID_ARGUMENT (units or
 * config that do not match, naming the first difference), IO. */
ZINF_API int zinf_engine_load(zinf_engine* engine, const char* path, char** out_client_json);

/* ---- Streams ---------------------------------------------------------------
 * An ordered queue of work on the engine's device. Thread-safety: any thread;
 * one stream's order is the order its enqueue calls return in. */

/* A new stream on the engine's device. The stream keeps the device alive and
 * may outlive the engine. */
ZINF_API int zinf_stream_create(zinf_engine* engine, zinf_stream** out);

/* A framework's own stream on the engine's device, as a zinf stream: on a
 * CUDA device `native` is a cudaStream_t of that device (NULL: the legacy
 * default stream), e.g. PyTorch's torch.cuda.current_stream().cuda_stream,
 * so fetches make that stream wait and the framework's kernels need no
 * synchronization. The framework keeps the native stream alive until
 * zinf_stream_destroy, which waits for it but does not destroy it.
 * Errors: ZINF_ERR_INVALID_ARGUMENT (the cpu device, which has no native
 * streams; a stream of another GPU). */
ZINF_API int zinf_stream_adopt(zinf_engine* engine, void* native, zinf_stream** out);

/* Waits for the stream's work, then destroys it. NULL is a no-op. */
ZINF_API void zinf_stream_destroy(zinf_stream* stream);

/* Blocks until all work enqueued so far has run. Returns the stream's sticky
 * error: the first failure of any of its work (an engine task, a host
 * function that returned non-zero), again on every later call. */
ZINF_API int zinf_stream_synchronize(zinf_stream* stream);

/* A host function run in stream order, on a zinf worker thread (cpu device)
 * or through cudaLaunchHostFunc (CUDA, where it must not call CUDA). It must
 * not call zinf_stream_synchronize on its own stream. A non-zero return
 * value becomes the stream's sticky error (with that code when it is a
 * zinf_status, else ZINF_ERR_INTERNAL). */
typedef int (*zinf_host_fn)(void* user_data);

/* Enqueues fn(user_data) after everything enqueued on the stream before.
 * `user_data` must stay valid until fn has run. Returns at once. */
ZINF_API int zinf_stream_enqueue_host(zinf_stream* stream, zinf_host_fn fn, void* user_data);

typedef enum zinf_copy_kind {
  ZINF_COPY_HOST_TO_DEVICE = 0,
  ZINF_COPY_DEVICE_TO_HOST = 1,
  ZINF_COPY_DEVICE_TO_DEVICE = 2
} zinf_copy_kind;

/* Enqueues an asynchronous copy of `bytes` bytes in stream order; the host
 * memory must stay untouched until the stream has passed the copy. */
ZINF_API int zinf_stream_copy(zinf_stream* stream, void* dst, const void* src, uint64_t bytes, zinf_copy_kind kind);

/* The native stream: cudaStream_t on a CUDA device, NULL on the cpu device
 * (and for a NULL stream). Any thread. */
ZINF_API void* zinf_stream_native_handle(const zinf_stream* stream);

/* ---- Asynchronous file I/O (the aio handle) ---------------------------------
 * Requests are split into blocks of `block_size` bytes spread over
 * `num_threads` worker threads (one io_uring each, `queue_depth` blocks in
 * flight per ring); short transfers are resubmitted. A failed request's
 * message names op, path, offset, length and errno. Files opened with
 * ZINF_FILE_DIRECT (O_DIRECT) need buffer address, offset and length
 * aligned to 4096: a violation is ZINF_ERR_INVALID_ARGUMENT.
 * Thread-safety: every zinf_aio_*, zinf_file_* and zinf_aio_request_*
 * function may be called from any thread, except that a handle must not be
 * used concurrently with its own destroy/close/free. */
typedef struct zinf_aio zinf_aio;
typedef struct zinf_file zinf_file;
typedef struct zinf_aio_request zinf_aio_request;

#define ZINF_AIO_SINGLE_SUBMIT 1u    /* one io_uring_submit per block instead of per batch */
#define ZINF_AIO_POSIX 2u            /* the pread/pwrite thread pool instead of io_uring */
#define ZINF_AIO_NO_FIXED_BUFFERS 4u /* do not use registered buffers */

/* block_size: bytes per block, a multiple of 4096 (0: 1 MiB); queue_depth
 * (0: 32); num_threads: rings (0: 1); flags: ZINF_AIO_*. io_uring falls back
 * to the thread pool (and logs why once) where it cannot be set up.
 * Errors: ZINF_ERR_INVALID_ARGUMENT, ZINF_ERR_UNAVAILABLE. */
ZINF_API int zinf_aio_create(uint64_t block_size, unsigned queue_depth, unsigned num_threads, unsigned flags,
                             zinf_aio** out);

/* The same from a DeepSpeed-style config's "aio" block (block_size,
 * queue_depth, intra_op_parallelism, single_submit, io_backend) and
 * "zinf": {"aio": {...}}. Errors: as zinf_engine_create's config errors. */
ZINF_API int zinf_aio_create_from_config(const char* config_json, zinf_aio** out);

/* Waits for every request in flight, then frees the handle. Files and
 * requests it made stay valid (they hold what they need). NULL: no-op. */
ZINF_API void zinf_aio_destroy(zinf_aio* aio);

/* "io_uring" or "posix" (static storage; "" for NULL). */
ZINF_API const char* zinf_aio_backend(const zinf_aio* aio);

#define ZINF_FILE_READ 0u     /* O_RDONLY */
#define ZINF_FILE_WRITE 1u    /* O_RDWR */
#define ZINF_FILE_CREATE 2u   /* O_CREAT (mode 0644); with ZINF_FILE_WRITE */
#define ZINF_FILE_TRUNCATE 4u /* O_TRUNC; with ZINF_FILE_WRITE */
#define ZINF_FILE_DIRECT 8u   /* O_DIRECT (4096-byte alignment, see above) */

/* Opens `path` for I/O through `aio`. Errors: ZINF_ERR_NOT_FOUND (missing
 * file), ZINF_ERR_IO (other open failures, e.g. O_DIRECT unsupported by the
 * filesystem), ZINF_ERR_INVALID_ARGUMENT (bad flags). */
ZINF_API int zinf_aio_open(zinf_aio* aio, const char* path, unsigned flags, zinf_file** out);

/* The file's current size in bytes. */
ZINF_API int zinf_file_size(const zinf_file* file, uint64_t* out_bytes);

/* Releases the caller's reference; the descriptor closes once no request in
 * flight uses it. NULL is a no-op. */
ZINF_API void zinf_file_close(zinf_file* file);

/* Submits a read of `length` bytes at `offset` into `buffer` (or a write
 * from it) and returns at once. The buffer must stay valid and untouched
 * until the request completes. *out_request receives a handle to wait on
 * (free it with zinf_aio_request_free); with out_request NULL the request is
 * only reaped by zinf_aio_wait_all. Reading past the end of the file is
 * ZINF_ERR_DATA_LOSS when the request completes.
 * Errors here: ZINF_ERR_INVALID_ARGUMENT (NULL buffer, O_DIRECT alignment). */
ZINF_API int zinf_aio_pread(zinf_aio* aio, zinf_file* file, void* buffer, uint64_t length, uint64_t offset,
                            zinf_aio_request** out_request);
ZINF_API int zinf_aio_pwrite(zinf_aio* aio, zinf_file* file, const void* buffer, uint64_t length, uint64_t offset,
                             zinf_aio_request** out_request);

/* Blocks until the request completed; returns its status (ZINF_ERR_IO naming
 * op, path, offset, length and errno; ZINF_ERR_DATA_LOSS at end of file).
 * *out_bytes (may be NULL) receives the bytes transferred, on failure too.
 * May be called again and from several threads. */
ZINF_API int zinf_aio_request_wait(zinf_aio_request* request, uint64_t* out_bytes);

/* *out_done = 1 when the request has completed, else 0; never blocks. */
ZINF_API int zinf_aio_request_done(const zinf_aio_request* request, int* out_done);

/* Frees the handle; the request itself still runs to completion and is still
 * reaped by zinf_aio_wait_all. NULL is a no-op. */
ZINF_API void zinf_aio_request_free(zinf_aio_request* request);

/* Blocks until every request submitted through `aio` since the last
 * zinf_aio_wait_all completed (DeepSpeed's handle.wait()), including those
 * already waited on through their own handle. *out_num_requests (may be
 * NULL) receives how many that was, on failure too. Returns the first
 * failure among them in submission order; all of them have completed and
 * are forgotten either way. */
ZINF_API int zinf_aio_wait_all(zinf_aio* aio, uint64_t* out_num_requests);

/* Registers [addr, addr+bytes) for io_uring fixed-buffer I/O: 4096-aligned,
 * at most 1 GiB. A no-op success on the posix backend. Unregister only with
 * no I/O in flight on the buffer. */
ZINF_API int zinf_aio_register_buffer(zinf_aio* aio, void* addr, uint64_t bytes);
ZINF_API int zinf_aio_unregister_buffer(zinf_aio* aio, void* addr);

/* ---- CPU Adam / AdamW over caller buffers ----------------------------------
 * The optimizer the engine runs at each boundary (one documented operation
 * sequence, without FMA contraction, identical on every SIMD level), over
 * the caller's host buffers. Work is split into 64 Ki-element blocks over
 * the handle's threads; the result does not depend on the thread count.
 * Thread-safety: any thread; concurrent steps on one handle are safe on
 * disjoint buffers. */
typedef struct zinf_adam zinf_adam;

typedef struct zinf_adam_options {
  double lr;           /* >= 0 */
  double beta1;        /* [0, 1) */
  double beta2;        /* [0, 1) */
  double eps;          /* > 0 */
  double weight_decay; /* >= 0 */
  int adamw_mode;      /* 1: decoupled weight decay (AdamW), 0: L2 added to the gradient (Adam) */
  int bias_correction; /* 1: divide by 1 - beta^step */
} zinf_adam_options;

/* DeepSpeed's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay
 * 0, adamw_mode 1, bias_correction 1. Writes nothing for NULL. */
ZINF_API void zinf_adam_options_default(zinf_adam_options* out);

/* A handle owning `num_threads` worker threads (0: one per available core).
 * Errors: ZINF_ERR_INVALID_ARGUMENT for a negative count. */
ZINF_API int zinf_adam_create(int num_threads, zinf_adam** out);

/* Frees the handle (no step may be running on it). NULL is a no-op. */
ZINF_API void zinf_adam_destroy(zinf_adam* adam);

/* One step (`step` >= 1, the caller's counter) over num_elems elements:
 * params, exp_avg and exp_avg_sq (fp32) are updated in place from `grads`
 * (grad_dtype) multiplied by `grad_scale` (fold 1/loss_scale and a clipping
 * coefficient here; 1 for neither). With `param_copy` non-NULL the updated
 * parameter is also written to it as param_copy_dtype (bf16 or fp16), in the
 * same pass. No buffer may overlap another. Blocks until done.
 * Errors: ZINF_ERR_INVALID_ARGUMENT naming the bad option or buffer. */
ZINF_API int zinf_adam_step(zinf_adam* adam, const zinf_adam_options* options, int64_t step, double grad_scale,
                            float* params, float* exp_avg, float* exp_avg_sq, const void* grads, zinf_dtype grad_dtype,
                            void* param_copy, zinf_dtype param_copy_dtype, size_t num_elems);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZINF_ZINF_H_ */
