// caliper calibrate: create a session, stream dumps (one Observe stream per file, several at
// once) and checkpoint weights, finalize, and write the deployment's scale files.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli_args.h"
#include "client/file_io.h"
#include "client/remote_commands.h"
#include "client/remote_common.h"
#include "client/rpc_retry.h"
#include "client/tensor_stream.h"
#include "core/calibration/model_config.h"

namespace caliper::cli {
namespace {

namespace fs = std::filesystem;

const std::vector<FlagSpec>& CalibrateFlags() {
  static const std::vector<FlagSpec> flags = WithConnectionFlags({
      {"server", "ADDR", "caliper-server address, e.g. localhost:50051"},
      {"model", "CONFIG", "the model's Hugging Face config.json"},
      {"tensors", "PATH...", "dump files, or directories of *.safetensors (a glob works)", true},
      {"out", "DIR", "output directory (created)"},
      {"kv", "MODE", "per_head (default), per_tensor or off"},
      {"fp8", "FLAVOR", "e4m3fn (default, qmax 448) or e4m3fnuz (qmax 240)"},
      {"nvfp4", "", "also compute NVFP4 global scales (activations from {module}.input)"},
      {"weights", "DIR", "HF checkpoint for NVFP4 weight scales (needs --nvfp4)"},
      {"observer", "NAME", "activation observer: static_minmax (default) or minmax"},
      {"warmup", "N", "skip forward passes (batches) below N"},
      {"deploy-tp", "T", "TP size of the deployment to write files for (default: the dumps')"},
      {"convention", "NAME", "NVFP4 form: compressed_tensors (divisor, default) or modelopt"},
      {"format", "NAME", "also write engine files: compressed-tensors, modelopt, vllm-legacy (repeatable)", true},
      {"name", "TEXT", "session label shown by `caliper sessions`"},
      {"streams", "N", "concurrent Observe streams, one per file (default 4)"},
      {"chunk-bytes", "N", "largest chunk payload in bytes (default 4194304)"},
      {"allow-rejected", "", "finalize and write even if the server rejected chunks"},
  });
  return flags;
}

constexpr absl::string_view kDescription =
    "Creates a calibration session on caliper-server, streams every tensor of the given\n"
    "safetensors dumps (K/V as model.layers.{L}.self_attn.k|v [tokens, kv_heads_local, head_dim],\n"
    "activations as {module}.input; __metadata__ tp_rank/tp_size/batch, absent = unsharded, one\n"
    "batch per file) and, with --weights, the checkpoint's {module}.weight tensors; then\n"
    "finalizes and writes into DIR:\n"
    "  kv_cache_calib.json  LightLLM FP8 KV calibration, full rows for the deployment's heads\n"
    "  scales.json          per-layer K/V absmax and scales, NVFP4 global scales per module with\n"
    "                       their fused group, warnings, session id, deployment\n"
    "Tensors are split along the token dimension into chunks; one stream per file, several at\n"
    "once. If the server rejects any chunk, each is reported (file, sequence, tensor, message),\n"
    "the session is left open and nothing is written, unless --allow-rejected.\n"
    "Exit codes: 0 written, 1 the server refused (message printed), 2 usage or input error,\n"
    "3 I/O failure (an output file could not be written).";

struct Progress {
  std::atomic<int64_t> sent{0};
  int64_t total = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

void DrawProgress(const Progress& p, std::ostream& err, bool final_line) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - p.start).count();
  const double sent = static_cast<double>(p.sent.load());
  const double fraction = p.total > 0 ? std::min(1.0, sent / static_cast<double>(p.total)) : 1.0;
  const int width = 30, filled = static_cast<int>(fraction * width);
  err << "\r[" << std::string(filled, '#') << std::string(width - filled, ' ') << "] "
      << absl::StrFormat("%3.0f%% %s / %s  %s/s ", fraction * 100, HumanBytes(sent),
                         HumanBytes(static_cast<double>(p.total)),
                         HumanBytes(elapsed > 0 ? sent / elapsed : 0))
      << (final_line ? "\n" : "") << std::flush;
}

// Files named on the command line; directories contribute their *.safetensors, sorted.
absl::StatusOr<std::vector<std::string>> ExpandTensorPaths(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      std::vector<std::string> found;
      for (const auto& item : fs::directory_iterator(path, ec)) {
        if (item.path().extension() == ".safetensors") found.push_back(item.path().string());
      }
      std::sort(found.begin(), found.end());
      if (found.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("--tensors: no *.safetensors in ", path));
      }
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(path, ec)) {
      files.push_back(path);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--tensors: no such file: ", path));
    }
  }
  return files;
}

// "<hostname>" for producer ids: stable across restarts of this command on this host.
std::string ProducerHost() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

// An ostream that hands each completed line to `out` under `mu` (worker threads share stderr).
class LockedLineStream : public std::ostream {
 public:
  LockedLineStream(std::ostream& out, std::mutex& mu) : std::ostream(&buffer_), buffer_(out, mu) {}

 private:
  class LineBuffer : public std::stringbuf {
   public:
    LineBuffer(std::ostream& out, std::mutex& mu) : out_(out), mu_(mu) {}
    int sync() override {
      std::lock_guard<std::mutex> lock(mu_);
      out_ << str();
      out_.flush();
      str("");
      return 0;
    }

   private:
    std::ostream& out_;
    std::mutex& mu_;
  };
  LineBuffer buffer_;
};

int UsageError(std::ostream& err, absl::string_view message) {
  err << "caliper calibrate: " << message << " (see caliper calibrate --help)\n";
  return kExitUsage;
}

std::string Describe(const PlannedChunk& chunk) {
  std::string out = chunk.tensor;
  if (chunk.first_row > 0 || !chunk.shape.empty()) {
    absl::StrAppend(&out, " rows ", chunk.first_row, "..",
                    chunk.first_row + (chunk.shape.empty() ? 0 : chunk.shape[0]));
  }
  return out;
}

}  // namespace

int RunCalibrateCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  auto flags = CliArgs::Parse(args, CalibrateFlags());
  if (!flags.ok()) return UsageError(err, flags.status().message());
  if (flags->help()) {
    out << FormatHelp("calibrate",
                      "--server ADDR --model CONFIG --tensors PATH... --out DIR [--kv MODE] "
                      "[--nvfp4 [--weights DIR]] [--deploy-tp T]",
                      kDescription, CalibrateFlags());
    return kExitOk;
  }
  auto flag = [&](const std::string& name, const std::string& fallback = "") {
    return flags->Get(name).value_or(fallback);
  };
  for (const char* required : {"server", "model", "out"}) {
    if (flag(required).empty()) return UsageError(err, absl::StrCat("--", required, " is required"));
  }
  if (flags->GetAll("tensors").empty() && !flags->Has("weights")) {
    return UsageError(err, "--tensors is required (or --weights with --nvfp4)");
  }

  // Recipe.
  v1::CreateSessionRequest create;
  v1::Recipe& recipe = *create.mutable_recipe();
  const std::string kv = flag("kv", "per_head");
  if (kv == "per_head") {
    recipe.set_kv(v1::KV_PER_HEAD);
  } else if (kv == "per_tensor") {
    recipe.set_kv(v1::KV_PER_TENSOR);
  } else if (kv == "off") {
    recipe.set_kv(v1::KV_OFF);
  } else {
    return UsageError(err, absl::StrCat("--kv: expected per_head, per_tensor or off, got \"", kv, "\""));
  }
  const std::string fp8 = flag("fp8", "e4m3fn");
  if (fp8 != "e4m3fn" && fp8 != "e4m3fnuz") {
    return UsageError(err, absl::StrCat("--fp8: expected e4m3fn or e4m3fnuz, got \"", fp8, "\""));
  }
  recipe.set_fp8_flavor(fp8 == "e4m3fnuz" ? v1::FP8_E4M3FNUZ : v1::FP8_E4M3FN);
  const bool nvfp4 = flags->Has("nvfp4");
  const std::string weights_dir = flag("weights");
  if (!weights_dir.empty() && !nvfp4) return UsageError(err, "--weights needs --nvfp4");
  recipe.set_nvfp4_activations(nvfp4);
  recipe.set_nvfp4_weights(nvfp4 && !weights_dir.empty());
  const std::string observer = flag("observer", "static_minmax");
  if (observer != "static_minmax" && observer != "minmax") {
    return UsageError(err, absl::StrCat("--observer: expected static_minmax or minmax, got \"",
                                        observer, "\""));
  }
  recipe.set_activation_observer(observer == "minmax" ? v1::MINMAX : v1::STATIC_MINMAX);
  if (!nvfp4 && recipe.kv() == v1::KV_OFF) {
    return UsageError(err, "nothing to calibrate: --kv=off without --nvfp4");
  }
  auto warmup = flags->GetInt("warmup", 0, int64_t{1} << 40);
  auto deploy_tp = flags->GetInt("deploy-tp", 1, 1 << 20);
  auto streams = flags->GetInt("streams", 1, 256);
  auto chunk_bytes = flags->GetInt("chunk-bytes", 1024, kMaxMessageBytes - (1 << 20));
  for (const auto* st : {&warmup.status(), &deploy_tp.status(), &streams.status(),
                         &chunk_bytes.status()}) {
    if (!st->ok()) return UsageError(err, st->message());
  }
  recipe.set_warmup_batches(warmup->value_or(0));
  auto convention = ParseConvention(flag("convention", "compressed_tensors"));
  if (!convention.ok()) return UsageError(err, convention.status().message());

  // Model: parsed here too, so a broken config.json is a usage error before any RPC.
  const std::string model_path = flag("model");
  auto config_text = ReadWholeFile(model_path);
  if (!config_text.ok()) return UsageError(err, absl::StrCat("--model ", config_text.status().message()));
  auto model = ParseHfConfig(*config_text);
  if (!model.ok()) return UsageError(err, absl::StrCat("--model: ", model_path, ": ", model.status().message()));
  create.mutable_model()->set_hf_config_json(*config_text);
  create.set_name(flag("name", absl::StrCat("calibrate ", model->architecture, " (",
                                                 fs::path(model_path).parent_path().filename().string(),
                                                 ")")));

  // Plan every stream before touching the server, so input errors cost nothing.
  PlanOptions plan_options;
  plan_options.kv = recipe.kv() != v1::KV_OFF;
  plan_options.inputs = nvfp4;
  plan_options.chunk_bytes = chunk_bytes->value_or(4 << 20);
  auto tensor_files = ExpandTensorPaths(flags->GetAll("tensors"));
  if (!tensor_files.ok()) return UsageError(err, tensor_files.status().message());
  std::vector<StreamPlan> plans;
  std::map<int, int64_t> batches_without_metadata;  // per rank: next implicit batch id
  int producer_tp = 1;
  int64_t total_bytes = 0;
  std::vector<std::string> skipped;
  for (const std::string& path : *tensor_files) {
    // Files without a batch in their metadata are one forward pass each, in command-line order.
    auto probe = SafetensorsFile::Open(path);
    if (!probe.ok()) return UsageError(err, probe.status().message());
    const bool has_batch = (*probe)->metadata().count("batch") > 0;
    int rank = 0;
    if (auto it = (*probe)->metadata().find("tp_rank"); it != (*probe)->metadata().end()) {
      rank = std::atoi(it->second.c_str());
    }
    auto plan = PlanDumpFile(path, plan_options, has_batch ? 0 : batches_without_metadata[rank]++);
    if (!plan.ok()) return UsageError(err, plan.status().message());
    producer_tp = std::max(producer_tp, plan->tp_size);
    total_bytes += plan->bytes;
    skipped.insert(skipped.end(), plan->skipped.begin(), plan->skipped.end());
    plans.push_back(std::move(*plan));
  }
  if (!weights_dir.empty()) {
    auto files = CheckpointFiles(weights_dir);
    if (!files.ok()) return UsageError(err, files.status().message());
    for (const std::string& path : *files) {
      auto plan = PlanWeightFile(path, plan_options.chunk_bytes);
      if (!plan.ok()) return UsageError(err, plan.status().message());
      total_bytes += plan->bytes;
      plans.push_back(std::move(*plan));
    }
  }
  if (total_bytes == 0) return UsageError(err, "no tensor to stream for this recipe in the given files");
  if (!skipped.empty()) {
    err << "caliper calibrate: not streaming " << skipped.size()
        << " tensor(s) this recipe does not use, e.g. " << skipped.front() << "\n";
  }

  // Session.
  const std::string server = flag("server");
  absl::StatusOr<ConnectionOptions> security = ConnectionOptionsFromArgs(*flags);
  if (!security.ok()) return UsageError(err, security.status().message());
  absl::StatusOr<std::shared_ptr<grpc::Channel>> made_channel = MakeChannel(server, *security);
  if (!made_channel.ok()) return UsageError(err, made_channel.status().message());
  auto channel = *std::move(made_channel);
  auto stub = v1::Calibration::NewStub(channel);
  const RetryPolicy retry = RetryPolicyWithAttempts(security->attempts, channel);
  v1::Session session;
  grpc::Status created = CreateSessionWithRetry(*channel, *stub, create, &session, retry, &err,
                                                "calibrate");
  if (!created.ok()) {
    return ReportRpcError(err, "calibrate", absl::StrCat("CreateSession on ", server), created);
  }
  // Flushed: with stdout in a file or pipe, the id is there while the streams run.
  out << "session   " << session.id() << "\n" << std::flush;

  // Streams: a small worker pool, one Observe call per file.
  Progress progress;
  progress.total = total_bytes;
  const bool tty = isatty(STDERR_FILENO) == 1;
  std::vector<StreamResult> results(plans.size());
  std::atomic<size_t> next{0};
  const int workers = static_cast<int>(std::min<size_t>(streams->value_or(4), plans.size()));
  std::vector<std::thread> pool;
  // Resume messages from worker threads, one whole line at a time.
  std::mutex err_mu;
  for (int w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      LockedLineStream log_err(err, err_mu);
      for (size_t i = next.fetch_add(1); i < plans.size(); i = next.fetch_add(1)) {
        results[i] = StreamPlanWithResume(channel, session.id(), plans[i],
                                          absl::StrCat(ProducerHost(), "/", plans[i].path),
                                          &progress.sent, retry, &log_err);
      }
    });
  }
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  std::thread drawer;
  if (tty) {
    drawer = std::thread([&] {
      std::unique_lock<std::mutex> lock(done_mu);
      while (!done_cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return done; })) {
        DrawProgress(progress, err, false);
      }
    });
  }
  for (auto& t : pool) t.join();
  {
    std::lock_guard<std::mutex> lock(done_mu);
    done = true;
  }
  done_cv.notify_all();
  if (drawer.joinable()) {
    drawer.join();
    DrawProgress(progress, err, true);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - progress.start).count();

  // Outcome of every stream: stream faults and rejected chunks are reported with their origin.
  int64_t accepted = 0, rejected = 0, accepted_bytes = 0, skipped_warmup = 0;
  bool stream_failed = false;
  for (size_t i = 0; i < plans.size(); ++i) {
    const StreamResult& r = results[i];
    accepted += r.summary.accepted_chunks();
    rejected += r.summary.rejected_chunks();
    accepted_bytes += r.summary.accepted_bytes();
    skipped_warmup += r.summary.skipped_warmup_chunks();
    if (!r.status.ok()) {
      stream_failed = true;
      ReportRpcError(err, "calibrate", absl::StrCat("Observe stream of ", plans[i].path), r.status);
    }
    for (const auto& e : r.summary.errors()) {
      // Producer sequences count from 1 (chunk index + 1).
      const std::string what = e.sequence() >= 1 && e.sequence() <= plans[i].chunks.size()
                                   ? Describe(plans[i].chunks[e.sequence() - 1])
                                   : std::string("?");
      const uint64_t index = e.sequence() >= 1 ? e.sequence() - 1 : 0;
      err << "caliper calibrate: rejected " << plans[i].path << " chunk " << index << " ("
          << what << "): " << e.code() << ": " << e.message() << "\n";
    }
    if (r.summary.rejected_chunks() > r.summary.errors_size()) {
      err << "caliper calibrate: ... and " << r.summary.rejected_chunks() - r.summary.errors_size()
          << " more rejected in " << plans[i].path << "\n";
    }
  }
  out << absl::StrFormat("streamed  %d chunks, %s in %.2f s (%s/s) over %d streams; %d rejected",
                         accepted, HumanBytes(static_cast<double>(accepted_bytes)), seconds,
                         HumanBytes(seconds > 0 ? static_cast<double>(accepted_bytes) / seconds : 0),
                         plans.size(), rejected);
  if (skipped_warmup > 0) out << ", " << skipped_warmup << " warm-up chunks skipped";
  out << "\n" << std::flush;
  if (stream_failed || (rejected > 0 && !flags->Has("allow-rejected"))) {
    err << "caliper calibrate: session " << session.id()
        << " left open and nothing written; fix the input and stream again, or pass "
           "--allow-rejected to finalize with what was accepted\n";
    return kExitServer;
  }

  // Finalize and fetch the deployment's scales.
  {
    // Finalize is idempotent (a finalized session answers OK), so a lost reply is retried.
    v1::FinalizeRequest request;
    request.set_session_id(session.id());
    Backoff backoff(retry, &err, "caliper calibrate: Finalize");
    grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& context) {
      return stub->Finalize(&context, request, &session);
    });
    if (!status.ok()) return ReportRpcError(err, "calibrate", "Finalize", status);
  }
  v1::Deployment deployment;
  deployment.set_tp_size(static_cast<int>(deploy_tp->value_or(producer_tp)));
  return FetchAndWriteScales(*stub, "calibrate", retry, session, deployment, *convention,
                             flags->GetAll("format"), flag("out"), out, err);
}

}  // namespace caliper::cli
