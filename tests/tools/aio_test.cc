// `zinf aio` as a user runs it: bad arguments, --verify, --json, sweep. The
// O_DIRECT case runs in-process with File's open hook, since this machine's
// filesystems (tmpfs included) all accept O_DIRECT.
#include "bench/aio.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "test_util.h"
#include "zinf/config.h"

namespace zinf::bench {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code;
  std::string out, err;
};

// Runs `exe` (default build/zinf) with `aio` and `args`; as user `uid` when
// >= 0 (the caller must be root), with `env` added to the environment.
CliRun Zinf(const std::vector<std::string>& args, int uid = -1, std::string exe = "",
            const std::vector<std::string>& env = {}) {
  if (exe.empty()) exe = zinf::test::BinaryDir() + "/zinf";
  // Per-process names: ctest runs several of these tests at once.
  const std::string tag = std::to_string(::getpid());
  std::string out_path = zinf::test::TestDir() + "/aio_stdout." + tag,
              err_path = zinf::test::TestDir() + "/aio_stderr." + tag;
  std::vector<std::string> argv_s = {exe, "aio"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s(env);
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    ::dup2(o, 1);
    ::dup2(e, 2);
    if (uid >= 0 && (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0)) ::_exit(99);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(98);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out_path), slurp(err_path)};
}

// True when user `uid` can search (enter) `dir` and every directory above it.
bool UserCanEnter(const std::string& dir, int uid) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(2);
    ::_exit(::access(dir.c_str(), X_OK) == 0 ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// A root-owned 0755 directory that user `uid` can enter, holding a copy of
// build/zinf and of the build tree's libraries it loads: the tree may sit in
// a directory only its owner may enter (mktemp -d, root's home), where `uid`
// could not start the binary at all. Empty, with `why` set, when no such
// place exists. The caller removes the directory.
std::string ZinfWhereUserCanRunIt(int uid, std::string* why) {
  std::vector<std::string> parents;
  if (const char* t = std::getenv("TMPDIR"); t && *t) parents.emplace_back(t);
  for (const char* p : {"/tmp", "/var/tmp", "/dev/shm"}) parents.emplace_back(p);
  const std::string zinf_bin = zinf::test::BinaryDir() + "/zinf";
  for (const std::string& parent : parents) {
    std::string templ = parent + "/zinf-aio-test-XXXXXX";
    if (!::mkdtemp(templ.data())) continue;
    const std::string dir = templ;
    ::chmod(dir.c_str(), 0755);
    if (!UserCanEnter(dir, uid)) {
      fs::remove_all(dir);
      continue;
    }
    std::error_code ec;
    fs::copy_file(zinf_bin, dir + "/zinf", ec);
    // The shared libraries that resolve into the build tree (libzinf.so and
    // the like) come along; LD_LIBRARY_PATH points the loader at them.
    auto ldd = zinf::test::RunCommand("ldd " + zinf_bin + " 2>/dev/null");
    std::istringstream lines(ldd.output);
    for (std::string line; !ec && std::getline(lines, line);) {
      auto arrow = line.find("=> ");
      if (arrow == std::string::npos) continue;
      std::string lib = line.substr(arrow + 3);
      lib = lib.substr(0, lib.find(" ("));
      if (lib.rfind(zinf::test::BinaryDir() + "/", 0) == 0) {
        fs::copy_file(lib, dir + "/" + fs::path(lib).filename().string(), fs::copy_options::overwrite_existing, ec);
      }
    }
    if (ec) {
      *why = "copying zinf to " + dir + ": " + ec.message();
      fs::remove_all(dir);
      return "";
    }
    return dir;
  }
  *why = "no directory that user " + std::to_string(uid) + " can enter among $TMPDIR, /tmp, /var/tmp, /dev/shm";
  return "";
}

std::string Fresh(const std::string& name) {
  std::string d = zinf::test::TestDir() + "/aio/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// One line on stderr, exit code 2, and the directory left as it was.
void ExpectUsageError(const std::string& dir, const std::vector<std::string>& args, const std::string& says,
                      int uid = -1, const std::string& exe = "", const std::vector<std::string>& env = {}) {
  auto before = std::distance(fs::directory_iterator(dir), fs::directory_iterator{});
  CliRun r = Zinf(args, uid, exe, env);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), before) << "left files in " << dir;
}

TEST(AioCliTest, BadArgumentsAreOneLineAndExitTwo) {
  std::string dir = Fresh("bad");
  std::string file = dir + "/t.dat";
  ExpectUsageError(dir, {"read", "--path", file, "--size", "5M", "--block-size", "1M", "--threads", "2"},
                   "--size 5.00 MiB is not a positive multiple of --block-size x --threads x paths");
  ExpectUsageError(dir, {"write", "--path", file, "--size", "8M", "--queue-depth", "0"}, "--queue-depth 0 is outside");
  ExpectUsageError(dir, {"read", "--path", dir, "--size", "8M"}, "is a directory; give a file path");
  ExpectUsageError(dir, {"read", "--path", dir + "/missing/t.dat", "--size", "8M"}, "does not exist");
  ExpectUsageError(dir, {"read", "--path", file, "--size", "8Q"}, "--size: invalid size '8Q'");
  ExpectUsageError(dir, {"write", "--path", file, "--size", "8M", "--block-size", "1000"},
                   "--block-size 1000 is not a positive multiple of 4096");
}

TEST(AioCliTest, UnwritablePathIsAUsageError) {
  if (::geteuid() != 0) {
    std::string dir = Fresh("unwritable");
    ::chmod(dir.c_str(), 0555);
    ExpectUsageError(dir, {"write", "--path", dir + "/t.dat", "--size", "8M"}, "is not writable");
    ::chmod(dir.c_str(), 0755);
    return;
  }
  // Root may write anywhere: run as nobody, in a directory that stays root's
  // 0755, with a copy of zinf that nobody can reach.
  constexpr int kNobody = 65534;
  std::string why;
  const std::string place = ZinfWhereUserCanRunIt(kNobody, &why);
  if (place.empty()) GTEST_SKIP() << why;
  const std::string dir = place + "/unwritable";
  fs::create_directory(dir);
  ::chmod(dir.c_str(), 0755);
  ExpectUsageError(dir, {"write", "--path", dir + "/t.dat", "--size", "8M"}, "is not writable", kNobody,
                   place + "/zinf", {"LD_LIBRARY_PATH=" + place});
  fs::remove_all(place);
}

int RefuseDirect(const char* path, int flags, unsigned mode) {
  if (flags & O_DIRECT) {
    errno = EINVAL;
    return -1;
  }
  return ::open(path, flags, mode);
}

TEST(AioCliTest, FilesystemWithoutODirectIsAnErrorAndLeavesNothing) {
  std::string dir = Fresh("nodirect");
  nvme::internal::SetOpenFunctionForTesting(&RefuseDirect);
  AioOptions o;
  o.kind = nvme::IoKind::kWrite;
  o.paths = {dir + "/t.dat"};
  o.size = 8 << 20;
  o.threads = 1;
  auto r = RunAio(o);
  nvme::internal::SetOpenFunctionForTesting(nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("does not support O_DIRECT"), std::string::npos) << r.status().message();
  EXPECT_TRUE(fs::is_empty(dir));
  // Buffered I/O still works there.
  o.buffered = true;
  nvme::internal::SetOpenFunctionForTesting(&RefuseDirect);
  auto buffered = RunAio(o);
  nvme::internal::SetOpenFunctionForTesting(nullptr);
  EXPECT_TRUE(buffered.ok()) << buffered.status().ToString();
}

TEST(AioCliTest, VerifyCatchesOneFlippedByte) {
  std::string dir = Fresh("verify");
  std::string file = dir + "/t.dat";
  std::vector<std::string> common = {"--path",    file, "--size",  "16M", "--block-size", "256K",
                                     "--threads", "2",  "--loops", "1",   "--verify"};
  std::vector<std::string> w = {"write"}, r = {"read"};
  w.insert(w.end(), common.begin(), common.end());
  r.insert(r.end(), common.begin(), common.end());
  ASSERT_EQ(Zinf(w).exit_code, 0);
  CliRun clean = Zinf(r);
  ASSERT_EQ(clean.exit_code, 0) << clean.err;

  int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char b;
  ASSERT_EQ(::pread(fd, &b, 1, 9999999), 1);
  b = static_cast<char>(b ^ 1);
  ASSERT_EQ(::pwrite(fd, &b, 1, 9999999), 1);
  ::fsync(fd);
  ::close(fd);
  CliRun bad = Zinf(r);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("verify: " + file + " offset=9999999"), std::string::npos) << bad.err;
}

// A plain write (no --verify) sends data that storage cannot compress or
// deduplicate, as fio does by default: no 4 KiB page of the file is zeros,
// no two are the same, and none holds --verify's pattern. With
// --fixed-buffers the buffers are registered once for the lay-out and every
// loop.
TEST(AioCliTest, PlainWriteSendsNeitherZerosNorRepeatedPages) {
  std::string dir = Fresh("plain");
  std::string file = dir + "/t.dat";
  constexpr uint64_t kSize = 8 << 20;
  // A 1 MiB file first, so the write below lays out the rest and then loops.
  ASSERT_EQ(Zinf({"write", "--path", file, "--size", "1M", "--block-size", "256K", "--threads", "1", "--loops", "1"})
                .exit_code,
            0);
  CliRun w = Zinf({"write", "--path", file, "--size", "8M", "--block-size", "256K", "--threads", "2", "--queue-depth",
                   "4", "--loops", "2", "--fixed-buffers"});
  ASSERT_EQ(w.exit_code, 0) << w.err;
  EXPECT_NE(w.out.find("laid out"), std::string::npos) << w.out;
  std::ifstream in(file, std::ios::binary);
  std::string bytes(kSize, '\0');
  ASSERT_TRUE(in.read(bytes.data(), kSize));
  std::set<std::string> pages;
  const std::string zeros(4096, '\0');
  for (uint64_t o = 0; o < kSize; o += 4096) {
    std::string page = bytes.substr(o, 4096);
    EXPECT_NE(page, zeros) << "offset " << o;
    EXPECT_TRUE(pages.insert(page).second) << "the page at offset " << o << " repeats an earlier one";
  }
  // 32 blocks written from 8 buffers: a buffer's content is resent, so only
  // the per-block words keep pages apart. --verify finds no pattern there.
  CliRun r = Zinf(
      {"read", "--path", file, "--size", "8M", "--block-size", "256K", "--threads", "2", "--loops", "1", "--verify"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("verify: " + file + " offset="), std::string::npos) << r.err;
}

TEST(AioCliTest, JsonCarriesEveryPrintedFigure) {
  std::string dir = Fresh("json");
  std::string file = dir + "/t.dat";
  CliRun text = Zinf({"write", "--path", file, "--size", "16M", "--loops", "2"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  // The table's columns ...
  for (const char* col : {"GB/s", "IOPS", "p50 us", "p99 us", "cpu s", "cpu s/GB", "median"})
    EXPECT_NE(text.out.find(col), std::string::npos) << col;
  // ... are all in the JSON, per loop and as medians, with the configuration.
  CliRun js = Zinf({"read", "--path", file, "--size", "16M", "--loops", "2", "--json"});
  ASSERT_EQ(js.exit_code, 0) << js.err;
  auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["op"], "read");
  for (const char* k : {"paths", "size_bytes", "block_size", "queue_depth", "threads", "buffered", "fixed_buffers",
                        "sqpoll", "single_submit", "loops", "verify", "backend"})
    EXPECT_TRUE(j["config"].contains(k)) << k;
  EXPECT_EQ(j["config"]["single_submit"], false);
  EXPECT_NE(text.out.find("single submit off"), std::string::npos) << text.out;
  CliRun single = Zinf({"read", "--path", file, "--size", "16M", "--loops", "1", "--single-submit", "--json"});
  ASSERT_EQ(single.exit_code, 0) << single.err;
  EXPECT_EQ(nlohmann::json::parse(single.out)["config"]["single_submit"], true);
  ASSERT_EQ(j["loops"].size(), 2u);
  for (const auto& loop : j["loops"]) {
    for (const char* k : {"seconds", "gb_per_s", "iops", "p50_us", "p99_us", "cpu_seconds"})
      ASSERT_TRUE(loop.contains(k)) << k;
    double expect_gbps = 16.0 * (1 << 20) / loop["seconds"].get<double>() / 1e9;
    EXPECT_NEAR(loop["gb_per_s"].get<double>(), expect_gbps, 1e-6 * expect_gbps);
    EXPECT_LE(loop["p50_us"].get<double>(), loop["p99_us"].get<double>());
  }
  for (const char* k : {"seconds", "gb_per_s", "iops", "p50_us", "p99_us", "cpu_seconds"})
    EXPECT_TRUE(j["median"].contains(k)) << k;
  EXPECT_TRUE(j.contains("cpu_seconds_per_gb"));
}

TEST(AioCliTest, SweepWritesAConfigZinfAcceptsAndAHeatmap) {
  std::string dir = Fresh("sweep");
  std::string out = dir + "/aio.json", svg = dir + "/aio.svg";
  CliRun r = Zinf({"sweep", "--path", dir + "/s.dat", "--size", "16M", "--output", out, "--svg", svg});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("recommended (least read + write time measured again): "), std::string::npos) << r.out;
  // The progress lines: 196 runs of the grid, then 3 points x 2 submission modes x 2 ops.
  EXPECT_NE(r.err.find("[208/208]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" single "), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("measured again (the 3 points"), std::string::npos) << r.out;
  std::ifstream in(out);
  auto cfg = nlohmann::json::parse(in);
  EXPECT_TRUE(cfg["aio"].contains("block_size"));
  EXPECT_TRUE(cfg["aio"].contains("intra_op_parallelism"));
  ASSERT_TRUE(cfg["aio"]["single_submit"].is_boolean());
  // The printed recommendation is the one written.
  EXPECT_NE(
      r.out.find(std::string(", single submit ") + (cfg["aio"]["single_submit"].get<bool>() ? "on" : "off") + ", read"),
      std::string::npos)
      << r.out;
  auto loaded = LoadConfigFile(out);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::ifstream s(svg);
  std::string content((std::istreambuf_iterator<char>(s)), {});
  EXPECT_EQ(content.rfind("<svg", 0), 0u);
  EXPECT_EQ(std::count(content.begin(), content.end(), '\n') > 4 * 49, true);  // 4 panels of 7x7 cells
}

TEST(AioCliTest, SweepRecommendsTheFastestOfThePointsItMeasuredAgain) {
  std::string dir = Fresh("sweep_json");
  std::string out = dir + "/aio.json";
  CliRun r = Zinf({"sweep", "--path", dir + "/s.dat", "--size", "16M", "--output", out, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["points"].size(), 98u);
  auto time_per_byte = [](const nlohmann::json& p) {
    return 1 / p["read_gb_per_s"].get<double>() + 1 / p["write_gb_per_s"].get<double>();
  };
  // The three grid points with the least read + write time, each batched and single-submitted.
  std::vector<nlohmann::json> grid(j["points"].begin(), j["points"].end());
  std::stable_sort(grid.begin(), grid.end(),
                   [&](const auto& a, const auto& b) { return time_per_byte(a) < time_per_byte(b); });
  const auto& again = j["confirmed"];
  ASSERT_EQ(again.size(), 6u);
  for (size_t i = 0; i < again.size(); ++i) {
    for (const char* k : {"threads", "block_size", "queue_depth"}) EXPECT_EQ(again[i][k], grid[i / 2][k]) << i << k;
    EXPECT_EQ(again[i]["single_submit"], i % 2 == 1);
  }
  // The recommendation is the fastest of those runs, as written to the file.
  size_t best = 0;
  for (size_t i = 1; i < again.size(); ++i)
    if (time_per_byte(again[i]) < time_per_byte(again[best])) best = i;
  const auto& rec = j["recommended"]["aio"];
  EXPECT_EQ(rec["block_size"], again[best]["block_size"]);
  EXPECT_EQ(rec["queue_depth"], again[best]["queue_depth"]);
  EXPECT_EQ(rec["intra_op_parallelism"], again[best]["threads"]);
  EXPECT_EQ(rec["single_submit"], again[best]["single_submit"]);
  std::ifstream in(out);
  EXPECT_EQ(nlohmann::json::parse(in), j["recommended"]);
}

}  // namespace
}  // namespace zinf::bench
