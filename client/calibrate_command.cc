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

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/file_io.h"
#include "client/remote_commands.h"
#include "client/human_bytes.h"
#include "client/rpc_error.h"
#include "client/scales_flags.h"
#include "client/scales_output.h"
#include "client/server_connection.h"
#include "client/rpc_retry.h"
#include "client/tensor_stream.h"
#include "core/calibration/model_config.h"

namespace caliper::cli {
namespace {

namespace fs = std::filesystem;

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
        return UsageError(absl::StrCat("--tensors: no *.safetensors in ", path));
      }
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(path, ec)) {
      files.push_back(path);
    } else {
      return UsageError(absl::StrCat("--tensors: no such file: ", path));
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

std::string Describe(const PlannedChunk& chunk) {
  std::string out = chunk.tensor;
  if (chunk.first_row > 0 || !chunk.shape.empty()) {
    absl::StrAppend(&out, " rows ", chunk.first_row, "..",
                    chunk.first_row + (chunk.shape.empty() ? 0 : chunk.shape[0]));
  }
  return out;
}

// "static_minmax", "minmax", "mse" or "percentile:P" with P in (0, 100].
struct ObserverSpec {
  std::string name;
  double percentile = 0;
};
absl::StatusOr<ObserverSpec> ParseObserver(absl::string_view flag, const std::string& value) {
  if (value == "static_minmax" || value == "minmax" || value == "mse") return ObserverSpec{value};
  if (absl::StartsWith(value, "percentile:")) {
    double p = 0;
    if (absl::SimpleAtod(value.substr(11), &p) && p > 0 && p <= 100) {
      return ObserverSpec{"percentile", p};
    }
  }
  return UsageError(absl::StrCat("--", flag, ": \"", value,
                                 "\" is not static_minmax, minmax, mse or percentile:P with P in "
                                 "(0, 100]"));
}

}  // namespace

std::vector<FlagSpec> WithRecipeFlags(std::vector<FlagSpec> flags) {
  std::vector<FlagSpec> recipe = {
      KvFlag(),
      {.name = "fp8", .value_name = "FLAVOR",
       .help = "FP8 KV format: e4m3fn (qmax 448) or e4m3fnuz (qmax 240)",
       .default_value = "e4m3fn", .choices = {"e4m3fn", "e4m3fnuz"}},
      {.name = "attention", .value_name = "MODE",
       .help = "q: also the query's FP8 scale, per KV head (from model.layers.{L}.self_attn.q; "
               "needs --kv on; docs/attention-scales.md)",
       .default_value = "off", .choices = {"off", "q"}},
      {.name = "nvfp4",
       .help = "also compute NVFP4 global scales (activations from {module}.input)"},
      {.name = "observer", .value_name = "NAME",
       .help = "NVFP4 input observer: static_minmax, minmax, percentile:P or mse "
               "(llm-compressor's names; docs/observers.md)",
       .default_value = "static_minmax"},
      {.name = "kv-observer", .value_name = "NAME",
       .help = "FP8 KV observer: static_minmax, minmax, percentile:P or mse "
               "(docs/observers.md)",
       .default_value = "static_minmax"},
      {.name = "compat", .value_name = "NAME",
       .help = "llm-compressor: its arithmetic for every scale, in the model's dtype "
               "(absent: Caliper's correctly rounded float32; docs/observers.md)",
       .choices = {"llm-compressor"}},
      {.name = "histograms",
       .help = "keep |x| histograms for `caliper report` (implied by percentile and mse)"},
      {.name = "warmup", .value_name = "N", .help = "skip forward passes (batches) below N",
       .default_value = "0"},
  };
  flags.insert(flags.end(), recipe.begin(), recipe.end());
  return flags;
}

absl::StatusOr<v1::Recipe> RecipeFromFlags(const CliArgs& flags) {
  v1::Recipe recipe;
  recipe.set_kv(KvModeFromFlag(*flags.Get("kv")));
  recipe.set_fp8_flavor(*flags.Get("fp8") == "e4m3fnuz" ? v1::FP8_E4M3FNUZ : v1::FP8_E4M3FN);
  const bool nvfp4 = flags.Has("nvfp4");
  const bool weights = flags.Has("weights");
  if (weights && !nvfp4) return UsageError("--weights needs --nvfp4");
  recipe.set_nvfp4_activations(nvfp4);
  recipe.set_nvfp4_weights(nvfp4 && weights);
  absl::StatusOr<ObserverSpec> observer = ParseObserver("observer", *flags.Get("observer"));
  if (!observer.ok()) return observer.status();
  if (observer->name == "minmax") {
    recipe.set_activation_observer(v1::MINMAX);
  } else if (observer->name == "mse") {
    recipe.set_activation_observer(v1::MSE);
  } else if (observer->name == "percentile") {
    recipe.set_activation_observer(v1::PERCENTILE);
    recipe.set_activation_percentile(observer->percentile);
  } else {
    recipe.set_activation_observer(v1::STATIC_MINMAX);
  }
  absl::StatusOr<ObserverSpec> kv_observer =
      ParseObserver("kv-observer", *flags.Get("kv-observer"));
  if (!kv_observer.ok()) return kv_observer.status();
  if (kv_observer->name == "minmax") {
    recipe.set_kv_observer(v1::KV_OBSERVER_MINMAX);
  } else if (kv_observer->name == "mse") {
    recipe.set_kv_observer(v1::KV_OBSERVER_MSE);
  } else if (kv_observer->name == "percentile") {
    recipe.set_kv_observer(v1::KV_OBSERVER_PERCENTILE);
    recipe.set_kv_percentile(kv_observer->percentile);
  } else {
    recipe.set_kv_observer(v1::KV_OBSERVER_STATIC_MINMAX);
  }
  recipe.set_attention(*flags.Get("attention") == "q" ? v1::ATTENTION_Q : v1::ATTENTION_OFF);
  recipe.set_histograms(flags.Has("histograms"));
  if (flags.Get("compat") == std::optional<std::string>("llm-compressor")) {
    recipe.set_compat(v1::COMPAT_LLM_COMPRESSOR);
  }
  if (!nvfp4 && recipe.kv() == v1::KV_OFF) {
    return UsageError("nothing to calibrate: --kv=off without --nvfp4");
  }
  auto warmup = flags.GetInt("warmup", 0, int64_t{1} << 40);
  if (!warmup.ok()) return UsageError(warmup.status().message());
  recipe.set_warmup_batches(**warmup);
  return recipe;
}

namespace {

// Step 2: the model, parsed here too, so a broken config.json is an input error before any RPC.
absl::Status DescribeModel(const CliArgs& flags, v1::CreateSessionRequest* create) {
  const std::string model_path = *flags.Get("model");
  auto config_text = ReadWholeFile(model_path);
  if (!config_text.ok()) return Annotate(config_text.status(), "--model ");
  auto model = ParseHfConfig(*config_text);
  if (!model.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model: ", model_path, ": ", model.status().message()));
  }
  create->mutable_model()->set_hf_config_json(*config_text);
  create->set_name(flags.Get("name").value_or(
      absl::StrCat("calibrate ", model->architecture, " (",
                   fs::path(model_path).parent_path().filename().string(), ")")));
  return absl::OkStatus();
}

struct StreamPlans {
  std::vector<StreamPlan> plans;  // dumps in command-line order, then checkpoint files
  int producer_tp = 1;            // the dumps' TP size
  int64_t total_bytes = 0;
};

// Step 3: every stream planned before touching the server, so input errors cost nothing.
absl::StatusOr<StreamPlans> PlanStreams(const CliArgs& flags, const v1::Recipe& recipe,
                                        int64_t chunk_bytes, std::ostream& err) {
  PlanOptions options;
  options.kv = recipe.kv() != v1::KV_OFF;
  options.inputs = recipe.nvfp4_activations();
  options.query = recipe.attention() == v1::ATTENTION_Q;
  options.chunk_bytes = chunk_bytes;
  auto tensor_files = ExpandTensorPaths(flags.GetAll("tensors"));
  if (!tensor_files.ok()) return tensor_files.status();
  StreamPlans out;
  std::map<int, int64_t> batches_without_metadata;  // per rank: next implicit batch id
  std::vector<std::string> skipped, ignored;
  for (const std::string& path : *tensor_files) {
    // Files without a batch in their metadata are one forward pass each, in command-line order.
    auto probe = SafetensorsFile::Open(path);
    if (!probe.ok()) return probe.status();
    const bool has_batch = (*probe)->metadata().count("batch") > 0;
    int rank = 0;
    if (auto it = (*probe)->metadata().find("tp_rank"); it != (*probe)->metadata().end()) {
      rank = std::atoi(it->second.c_str());
    }
    auto plan = PlanDumpFile(path, options, has_batch ? 0 : batches_without_metadata[rank]++);
    if (!plan.ok()) return plan.status();
    out.producer_tp = std::max(out.producer_tp, plan->tp_size);
    out.total_bytes += plan->bytes;
    skipped.insert(skipped.end(), plan->skipped.begin(), plan->skipped.end());
    ignored.insert(ignored.end(), plan->ignored.begin(), plan->ignored.end());
    out.plans.push_back(*std::move(plan));
  }
  if (flags.Has("weights")) {
    auto files = CheckpointFiles(*flags.Get("weights"));
    if (!files.ok()) return files.status();
    for (const std::string& path : *files) {
      auto plan = PlanWeightFile(path, chunk_bytes);
      if (!plan.ok()) return plan.status();
      out.total_bytes += plan->bytes;
      ignored.insert(ignored.end(), plan->ignored.begin(), plan->ignored.end());
      out.plans.push_back(*std::move(plan));
    }
  }
  if (out.total_bytes == 0) {
    return absl::InvalidArgumentError("no tensor to stream for this recipe in the given files");
  }
  if (!skipped.empty()) {
    err << "caliper calibrate: not streaming " << skipped.size()
        << " tensor(s) this recipe does not use, e.g. " << skipped.front() << "\n";
  }
  if (!ignored.empty()) {
    std::sort(ignored.begin(), ignored.end());
    ignored.erase(std::unique(ignored.begin(), ignored.end()), ignored.end());
    err << "caliper calibrate: warning: not streaming " << ignored.size()
        << " MoE router module(s), which stay unquantized (no scale is written), e.g. "
        << ignored.front() << "\n";
  }
  return out;
}

// Step 4: the streams, a small worker pool with one Observe call per file; a progress bar on a
// terminal. Returns one result per plan and the seconds it took.
std::vector<StreamResult> StreamAll(const std::shared_ptr<grpc::Channel>& channel,
                                    const std::string& session_id, const StreamPlans& streams,
                                    int max_workers, const RetryPolicy& retry, std::ostream& err,
                                    double* seconds) {
  const std::vector<StreamPlan>& plans = streams.plans;
  Progress progress;
  progress.total = streams.total_bytes;
  const bool tty = isatty(STDERR_FILENO) == 1;
  std::vector<StreamResult> results(plans.size());
  std::atomic<size_t> next{0};
  const int workers = static_cast<int>(std::min<size_t>(max_workers, plans.size()));
  std::vector<std::thread> pool;
  // Resume messages from worker threads, one whole line at a time.
  std::mutex err_mu;
  for (int w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      LockedLineStream log_err(err, err_mu);
      for (size_t i = next.fetch_add(1); i < plans.size(); i = next.fetch_add(1)) {
        results[i] = StreamPlanWithResume(channel, session_id, plans[i],
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
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - progress.start).count();
  return results;
}

// Step 5: the outcome of every stream. Stream faults and rejected chunks are reported with
// their origin; a ServerError when the session must stay open (nothing gets written).
absl::Status ReportStreams(const std::vector<StreamPlan>& plans,
                           const std::vector<StreamResult>& results, double seconds,
                           bool allow_rejected, const std::string& session_id, std::ostream& out,
                           std::ostream& err) {
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
      err << "caliper calibrate: "
          << RpcError(absl::StrCat("Observe stream of ", plans[i].path), r.status).message()
          << "\n";
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
  if (stream_failed || (rejected > 0 && !allow_rejected)) {
    return ServerError(absl::StrCat(
        "session ", session_id,
        " left open and nothing written; fix the input and stream again, or pass "
        "--allow-rejected to finalize with what was accepted"));
  }
  return absl::OkStatus();
}

// Step 6: Finalize. It is idempotent (a finalized session answers OK), so a lost reply is retried.
absl::Status FinalizeSession(v1::Calibration::Stub& stub, const RetryPolicy& retry,
                             v1::Session* session, std::ostream& err) {
  v1::FinalizeRequest request;
  request.set_session_id(session->id());
  Backoff backoff(retry, &err, "caliper calibrate: Finalize");
  grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& context) {
    return stub.Finalize(&context, request, session);
  });
  return status.ok() ? absl::OkStatus() : RpcError("Finalize", status);
}

// With --fleet: the dumps stream into the fleet's open window of --weight-version (opened
// when there is none), under the fleet's model and recipe; the window closes on its policy,
// or at once with --close. Nothing is written: `caliper scales --fleet` fetches a version.
absl::Status RunCalibrateIntoFleet(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  const std::string fleet = *flags.Get("fleet");
  if (!flags.Has("weight-version")) {
    return UsageError("--fleet needs --weight-version (the weights the dumps were taken with)");
  }
  for (const char* name : {"model", "out", "tp", "format", "convention", "kv-cache-dtype", "name",
                           "weights", "kv", "fp8", "attention", "nvfp4", "observer", "kv-observer",
                           "compat", "histograms", "warmup"}) {
    if (flags.Has(name)) {
      return UsageError(absl::StrCat("--", name, ": not with --fleet (the fleet's model and "
                                     "recipe apply; `caliper scales --fleet` writes files)"));
    }
  }
  if (flags.GetAll("tensors").empty()) return UsageError("--tensors is required");
  auto streams = flags.GetInt("streams", 1, 256);
  auto chunk_bytes = flags.GetInt("chunk-bytes", 1024, kMaxMessageBytes - (1 << 20));
  for (const auto* st : {&streams.status(), &chunk_bytes.status()}) {
    if (!st->ok()) return UsageError(st->message());
  }
  absl::StatusOr<ServerConnection> connection = Connect(*flags.Get("server"), flags);
  if (!connection.ok()) return connection.status();
  v1::Calibration::Stub* stub = connection->stub.get();
  const RetryPolicy& retry = connection->retry;
  v1::Fleet described;
  {
    v1::GetFleetRequest request;
    request.set_fleet(fleet);
    if (absl::Status s = UnaryWithRetry(*stub, &v1::Calibration::Stub::GetFleet, "calibrate",
                                        "GetFleet", request, &described, retry, err);
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<StreamPlans> plans = PlanStreams(flags, described.recipe(), **chunk_bytes, err);
  if (!plans.ok()) return plans.status();
  v1::FleetWindow window;
  {
    v1::OpenWindowRequest request;
    request.set_fleet(fleet);
    request.set_weight_version(*flags.Get("weight-version"));
    // Idempotent: a retry joins the window the lost reply named.
    if (absl::Status s = UnaryWithRetry(*stub, &v1::Calibration::Stub::OpenWindow, "calibrate",
                                        "OpenWindow", request, &window, retry, err);
        !s.ok()) {
      return s;
    }
  }
  out << "window    " << window.session_id() << " of fleet " << fleet << ", weight version "
      << window.weight_version() << (window.created() ? " (opened)" : " (joined)") << "\n"
      << std::flush;
  double seconds = 0;
  const std::vector<StreamResult> results = StreamAll(
      connection->channel, window.session_id(), *plans, static_cast<int>(**streams), retry, err,
      &seconds);
  if (absl::Status s = ReportStreams(plans->plans, results, seconds, flags.Has("allow-rejected"),
                                     window.session_id(), out, err);
      !s.ok()) {
    return s;
  }
  if (!flags.Has("close")) return absl::OkStatus();
  v1::CloseWindowRequest request;
  request.set_fleet(fleet);
  request.set_session_id(window.session_id());
  v1::FleetWindow closed;
  grpc::ClientContext context;  // once: a retry after a lost reply would find it closed
  if (grpc::Status status = stub->CloseWindow(&context, request, &closed); !status.ok()) {
    return RpcError("CloseWindow", status);
  }
  out << "closed    " << closed.tokens() << " K/V tokens; decision " << closed.decision();
  if (!closed.detail().empty()) out << " (" << closed.detail() << ")";
  out << (closed.version() != 0 ? absl::StrCat("; version ", closed.version())
                                : std::string("; no new version"))
      << "\n";
  return absl::OkStatus();
}

absl::Status RunCalibrate(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  if (flags.Has("fleet")) return RunCalibrateIntoFleet(flags, out, err);
  for (const char* name : {"weight-version", "close"}) {
    if (flags.Has(name)) return UsageError(absl::StrCat("--", name, " needs --fleet"));
  }
  for (const char* name : {"model", "out"}) {
    if (!flags.Has(name)) return UsageError(absl::StrCat("--", name, " is required (or --fleet)"));
  }
  if (flags.GetAll("tensors").empty() && !flags.Has("weights")) {
    return UsageError("--tensors is required (or --weights with --nvfp4)");
  }
  v1::CreateSessionRequest create;
  absl::StatusOr<v1::Recipe> recipe = RecipeFromFlags(flags);
  if (!recipe.ok()) return recipe.status();
  *create.mutable_recipe() = *recipe;
  auto deploy_tp = flags.GetInt("tp", 1, 1 << 20);
  auto streams = flags.GetInt("streams", 1, 256);
  auto chunk_bytes = flags.GetInt("chunk-bytes", 1024, kMaxMessageBytes - (1 << 20));
  for (const auto* st : {&deploy_tp.status(), &streams.status(), &chunk_bytes.status()}) {
    if (!st->ok()) return UsageError(st->message());
  }
  const v1::Nvfp4Convention convention = ConventionFromFlag(*flags.Get("convention"));
  if (absl::Status s = DescribeModel(flags, &create); !s.ok()) return s;
  absl::StatusOr<StreamPlans> plans = PlanStreams(flags, *recipe, **chunk_bytes, err);
  if (!plans.ok()) return plans.status();

  // Session.
  const std::string server = *flags.Get("server");
  absl::StatusOr<ServerConnection> connection = Connect(server, flags);
  if (!connection.ok()) return connection.status();
  const std::shared_ptr<grpc::Channel>& channel = connection->channel;
  v1::Calibration::Stub* stub = connection->stub.get();
  const RetryPolicy& retry = connection->retry;
  v1::Session session;
  grpc::Status created = CreateSessionWithRetry(*channel, *stub, create, &session, retry, &err,
                                                "calibrate");
  if (!created.ok()) return RpcError(absl::StrCat("CreateSession on ", server), created);
  // Flushed: with stdout in a file or pipe, the id is there while the streams run.
  out << "session   " << session.id() << "\n" << std::flush;

  double seconds = 0;
  const std::vector<StreamResult> results =
      StreamAll(channel, session.id(), *plans, static_cast<int>(**streams), retry, err, &seconds);
  if (absl::Status s = ReportStreams(plans->plans, results, seconds, flags.Has("allow-rejected"),
                                     session.id(), out, err);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = FinalizeSession(*stub, retry, &session, err); !s.ok()) return s;
  v1::Deployment deployment;
  deployment.set_tp_size(static_cast<int>(deploy_tp->value_or(plans->producer_tp)));
  deployment.set_kv_cache_dtype(KvCacheDtypeFromFlag(*flags.Get("kv-cache-dtype")));
  v1::ScalesRequest request;
  request.set_session_id(session.id());
  return FetchAndWriteScales(*stub, "calibrate", retry, request, session.recipe(), deployment,
                             convention,
                             flags.GetAll("format"), *flags.Get("out"), out, err);
}

}  // namespace

const CommandSpec& CalibrateCommand() {
  static const CommandSpec command{
      .name = "calibrate",
      .summary = "stream dumps to caliper-server, finalize, write LightLLM + scales.json",
      .synopsis = "--server ADDR --model CONFIG --tensors PATH... --out DIR [--kv MODE] "
                  "[--nvfp4 [--weights DIR]] [--tp T]  |  --server ADDR --fleet NAME "
                  "--weight-version V --tensors PATH... [--close]",
      .description =
          "Creates a calibration session on caliper-server, streams every tensor of the given\n"
          "safetensors dumps (K/V as model.layers.{L}.self_attn.k|v [tokens, kv_heads_local, head_dim],\n"
          "activations as {module}.input; __metadata__ tp_rank/tp_size/batch, absent = unsharded, one\n"
          "batch per file) and, with --weights, the checkpoint's {module}.weight tensors; then\n"
          "finalizes and writes into DIR:\n"
          "  kv_cache_calib.json  LightLLM FP8 KV calibration, full rows for the deployment's heads\n"
          "                       (--fp8 e4m3fnuz: compressed-tensors files instead; LightLLM\n"
          "                       holds e4m3fn only)\n"
          "  scales.json          per-layer K/V absmax and scales, NVFP4 global scales per module with\n"
          "                       their fused group, warnings, session id, deployment\n"
          "Tensors are split along the token dimension into chunks; one stream per file, several at\n"
          "once. If the server rejects any chunk, each is reported (file, sequence, tensor, message),\n"
          "the session is left open and nothing is written, unless --allow-rejected.\n"
          "With --fleet and --weight-version the dumps stream into the fleet's window of that weight\n"
          "version instead (opened when none is), under the fleet's model and recipe; the window\n"
          "closes on the fleet's policy, or at once with --close. `caliper scales --fleet` writes files.",
      .server = ServerUse::kAlways,
      .flags = WithConnectionFlags(WithRecipeFlags({
          {.name = "server", .value_name = "ADDR",
           .help = "caliper-server address, e.g. localhost:50051", .required = true},
          {.name = "model", .value_name = "CONFIG",
           .help = "the model's Hugging Face config.json (required unless --fleet)"},
          {.name = "tensors", .value_name = "PATH...",
           .help = "dump files, or directories of *.safetensors (a glob works)", .repeated = true},
          {.name = "out", .value_name = "DIR",
           .help = "output directory (created; required unless --fleet)"},
          {.name = "fleet", .value_name = "NAME",
           .help = "stream into this fleet's window instead of a new session (docs/fleets.md)"},
          {.name = "weight-version", .value_name = "V",
           .help = "with --fleet: the weight version the dumps were taken with"},
          {.name = "close",
           .help = "with --fleet: close the window after streaming and print the decision"},
          {.name = "weights", .value_name = "DIR",
           .help = "HF checkpoint for NVFP4 weight scales (needs --nvfp4)"},
          {.name = "tp", .value_name = "T",
           .help = "deployment TP size to write files for (absent: the dumps' TP size)",
           .aliases = {"deploy-tp"}},
          KvCacheDtypeFlag(),
          ConventionFlag(),
          FormatFlag(),
          {.name = "name", .value_name = "TEXT",
           .help = "session label shown by `caliper sessions` (absent: architecture and folder)"},
          {.name = "streams", .value_name = "N",
           .help = "concurrent Observe streams, one per file", .default_value = "4"},
          {.name = "chunk-bytes", .value_name = "N", .help = "largest chunk payload in bytes",
           .default_value = "4194304"},
          {.name = "allow-rejected",
           .help = "finalize and write even if the server rejected chunks"},
      })),
      .run = RunCalibrate,
  };
  return command;
}

}  // namespace caliper::cli
