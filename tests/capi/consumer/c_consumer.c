/* A C99 program built against an installed zinf (find_package or
 * pkg-config): trains dense layers through the engine with the forward and
 * backward passes enqueued as host functions in stream order, runs the aio
 * handle and the CPU Adam, and checks the error paths of the C ABI.
 *   c_consumer <scratch directory>
 * Exits 0 when every check passed; prints the failing check otherwise. */
#include <zinf/zinf.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense_model.h"

#define CHECK_OK(call)                                                                                               \
  do {                                                                                                               \
    int rc_ = (call);                                                                                                \
    if (rc_ != ZINF_OK) {                                                                                            \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, zinf_status_name(rc_), zinf_last_error()); \
      exit(1);                                                                                                       \
    }                                                                                                                \
  } while (0)
#define CHECK_CODE(call, code)                                                                                 \
  do {                                                                                                         \
    int rc_ = (call);                                                                                          \
    if (rc_ != (code)) {                                                                                       \
      fprintf(stderr, "%s:%d: %s -> %s (expected %s): %s\n", __FILE__, __LINE__, #call, zinf_status_name(rc_), \
              zinf_status_name(code), zinf_last_error());                                                      \
      exit(1);                                                                                                 \
    }                                                                                                          \
  } while (0)
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* ---- the engine, host functions in stream order -------------------------- */

typedef struct layer_task {
  int unit;
  float loss_scale;
  zinf_unit_pointers params, grads;
  dm_state* st;
} layer_task;

typedef struct batch_task {
  int index;
  dm_state* st;
} batch_task;

static int run_batch(void* p) {
  batch_task* t = (batch_task*)p;
  dm_make_batch(t->index, t->st);
  return 0;
}
static int run_forward(void* p) {
  layer_task* t = (layer_task*)p;
  dm_forward(t->unit, (const float*)t->params.tensors[0], (const float*)t->params.tensors[1], t->st);
  return 0;
}
static int run_backward(void* p) {
  layer_task* t = (layer_task*)p;
  dm_backward(t->unit, (const float*)t->params.tensors[0], (float*)t->grads.tensors[0], (float*)t->grads.tensors[1],
              t->loss_scale, t->st);
  return 0;
}
static int fail_with_data_loss(void* p) {
  (void)p;
  return ZINF_ERR_DATA_LOSS;
}

static const char* kConfig =
    "{\n"
    "  \"train_micro_batch_size_per_gpu\": 16,\n"
    "  \"gradient_accumulation_steps\": 2,\n"
    "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},\n"
    "  \"zero_optimization\": {\"stage\": 0},\n"
    "  \"zinf\": {\"device\": \"cpu\", \"device_memory\": 67108864}\n"
    "}\n";

/* Registers the model's units (parameters from `seed`). */
static void add_units(zinf_engine* engine, int seed) {
  float w[DM_WIDEST * DM_WIDEST], b[DM_WIDEST];
  for (int u = 0; u < DM_LAYERS; ++u) {
    dm_init_params(u, seed, w, b);
    int64_t wshape[2] = {dm_in[u], dm_out[u]}, bshape[1] = {dm_out[u]};
    zinf_param_spec specs[2] = {{"w", wshape, 2, ZINF_DTYPE_FP32, w}, {"b", bshape, 1, ZINF_DTYPE_FP32, b}};
    char name[16];
    snprintf(name, sizeof name, "dense%d", u);
    int unit = -1;
    CHECK_OK(zinf_engine_add_unit(engine, name, specs, 2, &unit));
    CHECK(unit == u);
  }
}

/* Runs optimizer steps [first, first + count) (batches by step index) and
 * returns the last step's loss; *first_loss (may be NULL) gets the first's. */
static double train(zinf_engine* engine, zinf_stream* stream, int first, int count, double* first_loss) {
  static dm_state st;
  batch_task batch = {0, &st};
  layer_task fwd[DM_LAYERS], bwd[DM_LAYERS];
  const int kAccumulation = 2;
  double last_loss = 0;
  for (int step = first; step < first + count; ++step) {
    double loss = 0;
    for (int m = 0; m < kAccumulation; ++m) {
      batch.index = step * kAccumulation + m;
      CHECK_OK(zinf_stream_enqueue_host(stream, run_batch, &batch));
      for (int u = 0; u < DM_LAYERS; ++u) {
        fwd[u].unit = u;
        fwd[u].st = &st;
        CHECK_OK(zinf_engine_fetch(engine, u, stream, &fwd[u].params));
        CHECK(fwd[u].params.num_tensors == 2 && fwd[u].params.dtype == ZINF_DTYPE_FP32);
        CHECK(fwd[u].params.num_elems == dm_weights(u) + dm_out[u]);
        CHECK_OK(zinf_stream_enqueue_host(stream, run_forward, &fwd[u]));
        CHECK_OK(zinf_engine_release(engine, u, stream));
      }
      float scale = 0;
      CHECK_OK(zinf_engine_loss_scale(engine, &scale));
      CHECK(scale == 1.0f);
      for (int u = DM_LAYERS - 1; u >= 0; --u) {
        bwd[u].unit = u;
        bwd[u].st = &st;
        bwd[u].loss_scale = scale;
        CHECK_OK(zinf_engine_fetch(engine, u, stream, &bwd[u].params));
        CHECK_OK(zinf_engine_grad_buffers(engine, u, &bwd[u].grads));
        CHECK_OK(zinf_stream_enqueue_host(stream, run_backward, &bwd[u]));
        CHECK_OK(zinf_engine_grads_ready(engine, u, stream));
        CHECK_OK(zinf_engine_release(engine, u, stream));
      }
      int boundary = -1;
      CHECK_OK(zinf_engine_step(engine, &boundary));
      CHECK(boundary == (m == kAccumulation - 1));
      /* The tasks' arguments (fwd, bwd, batch) are reused next micro-step. */
      CHECK_OK(zinf_stream_synchronize(stream));
      loss += st.loss / kAccumulation;
    }
    if (step == first && first_loss) *first_loss = loss;
    last_loss = loss;
  }
  return last_loss;
}

static size_t total_elems(void) {
  size_t total = 0;
  for (int u = 0; u < DM_LAYERS; ++u) total += (size_t)(dm_weights(u) + dm_out[u]);
  return total;
}

/* Every unit's fp32 master, back to back (malloc'ed). */
static float* read_masters(zinf_engine* engine) {
  float* all = (float*)malloc(total_elems() * 4);
  size_t at = 0;
  for (int u = 0; u < DM_LAYERS; ++u) {
    const size_t n = (size_t)(dm_weights(u) + dm_out[u]);
    CHECK_OK(zinf_engine_read_state(engine, u, ZINF_STATE_MASTER, all + at, n));
    at += n;
  }
  return all;
}

static void test_engine(const char* scratch) {
  zinf_comm* comm = NULL;
  CHECK_OK(zinf_comm_create_mpi(0, &comm)); /* a 1-rank communicator outside mpirun */
  int rank = -1, size = -1;
  CHECK_OK(zinf_comm_rank(comm, &rank));
  CHECK_OK(zinf_comm_size(comm, &size));
  CHECK(rank == 0 && size == 1);

  zinf_engine* engine = NULL;
  CHECK_OK(zinf_engine_create(kConfig, comm, &engine));
  add_units(engine, 5);
  zinf_engine_info info;
  CHECK_OK(zinf_engine_get_info(engine, &info));
  CHECK(info.rank == 0 && info.world_size == 1 && info.zero_stage == 0 && info.num_units == DM_LAYERS);
  CHECK(info.compute_dtype == ZINF_DTYPE_FP32 && info.gradient_accumulation_steps == 2);

  zinf_stream* stream = NULL;
  CHECK_OK(zinf_stream_create(engine, &stream));
  CHECK(zinf_stream_native_handle(stream) == NULL); /* the cpu device has no native stream */

  /* 20 steps, a checkpoint, 20 more. */
  const int kBoundaries = 40, kSaveAt = 20;
  double first_loss = 0;
  train(engine, stream, 0, kSaveAt, &first_loss);
  char ckpt_dir[4200];
  snprintf(ckpt_dir, sizeof ckpt_dir, "%s/c_consumer_ckpt", scratch);
  char* saved_path = NULL;
  CHECK_OK(zinf_engine_save(engine, ckpt_dir, "{\"next_step\": 20}", &saved_path));
  CHECK(strstr(saved_path, "step-20") != NULL);
  printf("c consumer: saved %s\n", saved_path);
  zinf_string_free(saved_path);
  CHECK_CODE(zinf_engine_save(engine, ckpt_dir, "{not json", NULL), ZINF_ERR_INVALID_ARGUMENT);
  const double last_loss = train(engine, stream, kSaveAt, kBoundaries - kSaveAt, NULL);
  printf("c consumer: engine loss %.6f -> %.6f over %d steps\n", first_loss, last_loss, kBoundaries);
  CHECK(isfinite(last_loss) && last_loss < 0.5 * first_loss);
  float* masters = read_masters(engine);

  /* A second engine with other initial values resumes from the checkpoint
   * and ends with the same loss and the same bits. */
  {
    zinf_engine* resumed = NULL;
    CHECK_OK(zinf_engine_create(kConfig, comm, &resumed));
    add_units(resumed, 77);
    char* client = NULL;
    char missing[4300];
    snprintf(missing, sizeof missing, "%s/no-such-checkpoint", scratch);
    CHECK_CODE(zinf_engine_load(resumed, missing, NULL), ZINF_ERR_NOT_FOUND);
    CHECK_OK(zinf_engine_load(resumed, ckpt_dir, &client));
    CHECK(strstr(client, "\"next_step\"") != NULL && strstr(client, "20") != NULL);
    zinf_string_free(client);
    zinf_stream* rs = NULL;
    CHECK_OK(zinf_stream_create(resumed, &rs));
    const double resumed_loss = train(resumed, rs, kSaveAt, kBoundaries - kSaveAt, NULL);
    float* resumed_masters = read_masters(resumed);
    printf("c consumer: resumed from the checkpoint: loss %.9g (uninterrupted %.9g)\n", resumed_loss, last_loss);
    CHECK(resumed_loss == last_loss);
    CHECK(memcmp(resumed_masters, masters, total_elems() * 4) == 0);
    free(resumed_masters);
    zinf_stream_destroy(rs);
    zinf_engine_destroy(resumed);
  }
  free(masters);

  char* stats = NULL;
  CHECK_OK(zinf_engine_stats_json(engine, &stats));
  CHECK(strstr(stats, "\"step\":40") != NULL && strstr(stats, "\"skipped\":false") != NULL);
  zinf_string_free(stats);
  char* config = NULL;
  CHECK_OK(zinf_engine_config_json(engine, &config));
  CHECK(strstr(config, "\"gradient_accumulation_steps\": 2") != NULL);
  zinf_string_free(config);

  /* The fp32 compute copy equals the master; a device-to-host copy of the
   * fetched parameters agrees with read_state. */
  for (int u = 0; u < DM_LAYERS; ++u) {
    const size_t n = (size_t)(dm_weights(u) + dm_out[u]);
    float* master = (float*)malloc(n * 4);
    float* compute = (float*)malloc(n * 4);
    float* copied = (float*)malloc(n * 4);
    CHECK_OK(zinf_engine_read_state(engine, u, ZINF_STATE_MASTER, master, n));
    CHECK_OK(zinf_engine_read_state(engine, u, ZINF_STATE_COMPUTE_PARAMS, compute, n));
    CHECK(memcmp(master, compute, n * 4) == 0);
    zinf_unit_pointers p;
    CHECK_OK(zinf_engine_fetch(engine, u, stream, &p));
    CHECK_OK(zinf_stream_copy(stream, copied, p.data, n * 4, ZINF_COPY_DEVICE_TO_HOST));
    CHECK_OK(zinf_engine_release(engine, u, stream));
    CHECK_OK(zinf_stream_synchronize(stream));
    CHECK(memcmp(master, copied, n * 4) == 0);
    CHECK_CODE(zinf_engine_read_state(engine, u, ZINF_STATE_MASTER, master, n + 1), ZINF_ERR_INVALID_ARGUMENT);
    free(master);
    free(compute);
    free(copied);
  }

  /* Error paths: no such unit; registration after the first fetch; a host
   * function's failure is the stream's sticky error. */
  zinf_unit_pointers p;
  CHECK_CODE(zinf_engine_fetch(engine, 99, stream, &p), ZINF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(zinf_last_error(), "no unit 99") != NULL);
  int64_t shape[1] = {4};
  zinf_param_spec late = {"late", shape, 1, ZINF_DTYPE_FP32, NULL};
  CHECK_CODE(zinf_engine_add_unit(engine, "late", &late, 1, NULL), ZINF_ERR_FAILED_PRECONDITION);
  zinf_stream* failing = NULL;
  CHECK_OK(zinf_stream_create(engine, &failing));
  CHECK_OK(zinf_stream_enqueue_host(failing, fail_with_data_loss, NULL));
  CHECK_CODE(zinf_stream_synchronize(failing), ZINF_ERR_DATA_LOSS);
  CHECK(strstr(zinf_last_error(), "host function returned 8") != NULL);
  CHECK_CODE(zinf_stream_synchronize(failing), ZINF_ERR_DATA_LOSS); /* sticky */
  zinf_stream_destroy(failing);

  zinf_stream_destroy(stream);
  zinf_engine_destroy(engine);
  zinf_comm_destroy(comm);
}

/* ---- errors and the library ----------------------------------------------- */

static void test_errors(void) {
  CHECK(zinf_abi_version() == ZINF_ABI_VERSION);
  CHECK(strcmp(zinf_version(), "0.1.0") == 0 || zinf_version()[0] != '\0');
  CHECK(strcmp(zinf_status_name(ZINF_ERR_IO), "IoError") == 0);
  CHECK(strcmp(zinf_status_name(12345), "Unknown") == 0);

  zinf_engine* engine = NULL;
  CHECK_CODE(zinf_engine_create("{\"zero_optimization\": {\"stage\": \"two\"}}", NULL, &engine),
             ZINF_ERR_INVALID_ARGUMENT);
  CHECK(engine == NULL);
  CHECK(strstr(zinf_last_error(), "zero_optimization.stage") != NULL);
  CHECK_CODE(zinf_engine_create("{\"zero_optimisation\": {}}", NULL, &engine), ZINF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(zinf_last_error(), "zero_optimization") != NULL); /* did you mean */
  CHECK_CODE(zinf_engine_create("{not json", NULL, &engine), ZINF_ERR_INVALID_ARGUMENT);
  CHECK_CODE(zinf_engine_create(NULL, NULL, &engine), ZINF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(zinf_last_error(), "config_json is NULL") != NULL);
  CHECK_CODE(zinf_engine_create_from_file("/nonexistent/ds_config.json", NULL, &engine), ZINF_ERR_NOT_FOUND);
  CHECK(strstr(zinf_last_error(), "/nonexistent/ds_config.json") != NULL);
  CHECK_CODE(zinf_engine_step(NULL, NULL), ZINF_ERR_INVALID_ARGUMENT);
  CHECK_CODE(zinf_set_log_level("loud"), ZINF_ERR_INVALID_ARGUMENT);
  CHECK_OK(zinf_set_log_level("warn"));
  CHECK(zinf_last_error()[0] == '\0'); /* a successful call clears it */
  CHECK_CODE(zinf_nccl_get_unique_id(NULL, ZINF_NCCL_UNIQUE_ID_BYTES), ZINF_ERR_INVALID_ARGUMENT);
  /* Destroying NULL is a no-op everywhere. */
  zinf_engine_destroy(NULL);
  zinf_stream_destroy(NULL);
  zinf_comm_destroy(NULL);
  zinf_aio_destroy(NULL);
  zinf_file_close(NULL);
  zinf_aio_request_free(NULL);
  zinf_adam_destroy(NULL);
  zinf_string_free(NULL);
}

/* ---- the aio handle ------------------------------------------------------- */

static void test_aio_with(const char* scratch, unsigned flags) {
  zinf_aio* aio = NULL;
  CHECK_OK(zinf_aio_create(1 << 20, 8, 2, flags, &aio));
  const char* backend = zinf_aio_backend(aio);
  CHECK(strcmp(backend, "io_uring") == 0 || strcmp(backend, "posix") == 0);
  if (flags & ZINF_AIO_POSIX) CHECK(strcmp(backend, "posix") == 0);

  char path[4096];
  snprintf(path, sizeof path, "%s/c_consumer_aio_%u.bin", scratch, flags);
  zinf_file* file = NULL;
  CHECK_OK(zinf_aio_open(aio, path, ZINF_FILE_WRITE | ZINF_FILE_CREATE | ZINF_FILE_TRUNCATE, &file));
  const uint64_t n = 3 * (1 << 20) + 123; /* several blocks and a tail */
  unsigned char* out = (unsigned char*)malloc(n);
  unsigned char* in = (unsigned char*)calloc(n, 1);
  for (uint64_t i = 0; i < n; ++i) out[i] = (unsigned char)(i * 131 + (i >> 12));
  zinf_aio_request* req = NULL;
  CHECK_OK(zinf_aio_pwrite(aio, file, out, n, 0, &req));
  uint64_t bytes = 0;
  CHECK_OK(zinf_aio_request_wait(req, &bytes));
  CHECK(bytes == n);
  int done = 0;
  CHECK_OK(zinf_aio_request_done(req, &done));
  CHECK(done == 1);
  zinf_aio_request_free(req);
  uint64_t file_bytes = 0;
  CHECK_OK(zinf_file_size(file, &file_bytes));
  CHECK(file_bytes == n);

  const uint64_t half = n / 2;
  CHECK_OK(zinf_aio_pread(aio, file, in, half, 0, NULL));
  CHECK_OK(zinf_aio_pread(aio, file, in + half, n - half, half, &req));
  uint64_t count = 0;
  CHECK_OK(zinf_aio_wait_all(aio, &count));
  CHECK(count == 3);                            /* the write (waited on already) and both reads */
  CHECK_OK(zinf_aio_request_wait(req, &bytes)); /* waiting again is fine */
  CHECK(bytes == n - half);
  zinf_aio_request_free(req);
  CHECK(memcmp(in, out, n) == 0);

  /* Reading past the end is DataLoss naming the path; wait_all reports it too. */
  CHECK_OK(zinf_aio_pread(aio, file, in, 4096, n, &req));
  CHECK_CODE(zinf_aio_request_wait(req, NULL), ZINF_ERR_DATA_LOSS);
  CHECK(strstr(zinf_last_error(), path) != NULL);
  zinf_aio_request_free(req);
  CHECK_CODE(zinf_aio_wait_all(aio, &count), ZINF_ERR_DATA_LOSS);
  CHECK(count == 1);
  CHECK_OK(zinf_aio_wait_all(aio, &count));
  CHECK(count == 0);

  zinf_file* missing = NULL;
  char missing_path[4200];
  snprintf(missing_path, sizeof missing_path, "%s/does-not-exist.bin", scratch);
  CHECK_CODE(zinf_aio_open(aio, missing_path, ZINF_FILE_READ, &missing), ZINF_ERR_NOT_FOUND);
  CHECK_CODE(zinf_aio_open(aio, path, ZINF_FILE_CREATE, &missing), ZINF_ERR_INVALID_ARGUMENT);
  CHECK_CODE(zinf_aio_pread(aio, file, NULL, 16, 0, NULL), ZINF_ERR_INVALID_ARGUMENT);

  zinf_file_close(file);
  zinf_aio_destroy(aio);
  remove(path);
  free(out);
  free(in);
}

static void test_aio(const char* scratch) {
  test_aio_with(scratch, 0);
  test_aio_with(scratch, ZINF_AIO_POSIX | ZINF_AIO_SINGLE_SUBMIT);
  zinf_aio* aio = NULL;
  CHECK_OK(zinf_aio_create_from_config("{\"aio\": {\"block_size\": 262144, \"io_backend\": \"posix\"}}", &aio));
  CHECK(strcmp(zinf_aio_backend(aio), "posix") == 0);
  zinf_aio_destroy(aio);
  CHECK_CODE(zinf_aio_create(0, 0, 0, 0x100, &aio), ZINF_ERR_INVALID_ARGUMENT);
}

/* ---- the CPU Adam --------------------------------------------------------- */

static void test_adam(void) {
  const size_t n = 70000; /* more than one 64 Ki-element block, and a tail */
  float* p = (float*)malloc(n * 4);
  float* m = (float*)calloc(n, 4);
  float* v = (float*)calloc(n, 4);
  float* g = (float*)malloc(n * 4);
  float* rp = (float*)malloc(n * 4);
  float* rm = (float*)calloc(n, 4);
  float* rv = (float*)calloc(n, 4);
  uint16_t* copy = (uint16_t*)malloc(n * 2);
  uint64_t s = 42;
  for (size_t i = 0; i < n; ++i) rp[i] = p[i] = dm_uniform(&s);

  zinf_adam* adam = NULL;
  CHECK_OK(zinf_adam_create(2, &adam));
  zinf_adam_options o;
  zinf_adam_options_default(&o);
  CHECK(o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.999 && o.adamw_mode == 1 && o.bias_correction == 1);
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  const double grad_scale = 0.5;
  double max_rel = 0;
  for (int64_t t = 1; t <= 3; ++t) {
    for (size_t i = 0; i < n; ++i) g[i] = dm_uniform(&s);
    CHECK_OK(zinf_adam_step(adam, &o, t, grad_scale, p, m, v, g, ZINF_DTYPE_FP32, copy, ZINF_DTYPE_BF16, n));
    /* Kingma & Ba with decoupled decay, in double. */
    const double bc1 = 1 - pow(o.beta1, (double)t), bc2 = 1 - pow(o.beta2, (double)t);
    for (size_t i = 0; i < n; ++i) {
      const double gi = g[i] * grad_scale;
      rm[i] = (float)(o.beta1 * rm[i] + (1 - o.beta1) * gi);
      rv[i] = (float)(o.beta2 * rv[i] + (1 - o.beta2) * gi * gi);
      const double pi = rp[i] * (1 - o.lr * o.weight_decay);
      rp[i] = (float)(pi - o.lr / bc1 * rm[i] / (sqrt(rv[i] / bc2) + o.eps));
    }
    for (size_t i = 0; i < n; ++i) {
      const double d = fabs((double)p[i] - rp[i]) / (fabs(rp[i]) + 1e-3);
      if (d > max_rel) max_rel = d;
      CHECK(copy[i] == dm_bf16_bits(p[i]));
    }
  }
  printf("c consumer: adam max relative difference from the double reference %.3g\n", max_rel);
  CHECK(max_rel < 1e-4); /* a sanity bound: test_capi.py checks the exact bits */

  zinf_adam_options bad = o;
  bad.beta1 = 1.5;
  CHECK_CODE(zinf_adam_step(adam, &bad, 1, 1.0, p, m, v, g, ZINF_DTYPE_FP32, NULL, ZINF_DTYPE_BF16, n),
             ZINF_ERR_INVALID_ARGUMENT);
  CHECK(strstr(zinf_last_error(), "beta") != NULL);
  CHECK_CODE(zinf_adam_step(adam, &o, 1, 1.0, p, m, v, NULL, ZINF_DTYPE_FP32, NULL, ZINF_DTYPE_BF16, n),
             ZINF_ERR_INVALID_ARGUMENT);
  CHECK_CODE(zinf_adam_step(adam, &o, 1, 1.0, p, p, v, g, ZINF_DTYPE_FP32, NULL, ZINF_DTYPE_BF16, n),
             ZINF_ERR_INVALID_ARGUMENT); /* overlapping buffers */
  CHECK_CODE(zinf_adam_step(adam, &o, 1, 1.0, p, m, v, g, ZINF_DTYPE_FP32, copy, ZINF_DTYPE_FP32, n),
             ZINF_ERR_INVALID_ARGUMENT);
  CHECK_CODE(zinf_adam_create(-1, &adam), ZINF_ERR_INVALID_ARGUMENT);
  zinf_adam_destroy(adam);
  free(p), free(m), free(v), free(g), free(rp), free(rm), free(rv), free(copy);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <scratch directory>\n", argv[0]);
    return 2;
  }
  test_errors();
  test_engine(argv[1]);
  test_aio(argv[1]);
  test_adam();
  printf("c consumer: all checks passed (zinf %s, ABI %d)\n", zinf_version(), zinf_abi_version());
  return 0;
}
