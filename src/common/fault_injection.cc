// The ZINF_FAULT plan: see fault_injection.h.
#include "common/fault_injection.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "common/logging.h"

namespace zinf::fault {
namespace {

enum class Kind : uint8_t { kNone, kAlloc, kEio, kEnospc, kRing, kNan, kCount };

struct Plan {
  Kind kind = Kind::kNone;
  int64_t at = 0;  // the event that fails, from 1
};

std::atomic<bool> g_armed{false};
std::atomic<int64_t> g_events{0};  // events of the plan's kind so far
Plan g_plan;                       // written before g_armed is set
std::once_flag g_from_env;
std::atomic<int64_t> g_site_events[5];  // count mode: every site's events

void PrintCounts() {
  std::fprintf(stderr, "ZINF_FAULT counts: alloc %lld, read %lld, write %lld, submit %lld, loss %lld\n",
               static_cast<long long>(g_site_events[0].load()), static_cast<long long>(g_site_events[1].load()),
               static_cast<long long>(g_site_events[2].load()), static_cast<long long>(g_site_events[3].load()),
               static_cast<long long>(g_site_events[4].load()));
}

bool Parse(const char* text, Plan* out) {
  *out = Plan{};
  if (!text || !*text) return true;
  if (std::strcmp(text, "count") == 0) {
    out->kind = Kind::kCount;
    return true;
  }
  const char* colon = std::strchr(text, ':');
  if (!colon) return false;
  const std::string kind(text, colon);
  char* end = nullptr;
  const long long n = std::strtoll(colon + 1, &end, 10);
  if (end == colon + 1 || *end != '\0' || n < 1) return false;
  if (kind == "alloc") {
    out->kind = Kind::kAlloc;
  } else if (kind == "eio") {
    out->kind = Kind::kEio;
  } else if (kind == "enospc") {
    out->kind = Kind::kEnospc;
  } else if (kind == "ring") {
    out->kind = Kind::kRing;
  } else if (kind == "nan") {
    out->kind = Kind::kNan;
  } else {
    return false;
  }
  out->at = n;
  return true;
}

void Install(const Plan& plan) {
  g_armed.store(false);
  g_plan = plan;
  g_events.store(0);
  g_armed.store(plan.kind != Kind::kNone);
}

void FromEnvironment() {
  std::call_once(g_from_env, [] {
    const char* env = std::getenv("ZINF_FAULT");
    Plan plan;
    if (!Parse(env, &plan)) {
      ZINF_LOG_ERROR("ZINF_FAULT={}: expected alloc:N, eio:N, enospc:N, ring:N or nan:N (N >= 1); ignored", env);
      return;
    }
    Install(plan);
    if (plan.kind == Kind::kCount) std::atexit(&PrintCounts);
  });
}

// Whether `site` is an event of the plan's kind.
bool Counts(Kind kind, Site site) {
  switch (kind) {
    case Kind::kAlloc:
      return site == Site::kDeviceAlloc;
    case Kind::kEio:
      return site == Site::kIoRead || site == Site::kIoWrite;
    case Kind::kEnospc:
      return site == Site::kIoWrite;
    case Kind::kRing:
      return site == Site::kRingSubmit;
    case Kind::kNan:
      return site == Site::kLoss;
    case Kind::kNone:
    case Kind::kCount:
      return false;
  }
  return false;
}

const char* SiteName(Site site) {
  switch (site) {
    case Site::kDeviceAlloc:
      return "device allocation";
    case Site::kIoRead:
      return "NVMe read";
    case Site::kIoWrite:
      return "NVMe write";
    case Site::kRingSubmit:
      return "io_uring submission";
    case Site::kLoss:
      return "loss";
  }
  return "?";
}

}  // namespace

int At(Site site) {
  FromEnvironment();
  if (!g_armed.load(std::memory_order_acquire)) return 0;
  const Plan plan = g_plan;
  if (plan.kind == Kind::kCount) {
    g_site_events[static_cast<int>(site)].fetch_add(1);
    return 0;
  }
  if (!Counts(plan.kind, site)) return 0;
  if (g_events.fetch_add(1) + 1 != plan.at) return 0;
  const int err = plan.kind == Kind::kAlloc    ? ENOMEM
                  : plan.kind == Kind::kEnospc ? ENOSPC
                  : plan.kind == Kind::kNan    ? EDOM
                                               : EIO;
  ZINF_LOG_WARN("ZINF_FAULT: injecting {} into {} #{}", std::strerror(err), SiteName(site),
                static_cast<long long>(plan.at));
  return err;
}

bool SetPlanForTesting(const char* plan) {
  FromEnvironment();
  Plan p;
  if (!Parse(plan, &p)) return false;
  Install(p);
  return true;
}

}  // namespace zinf::fault
