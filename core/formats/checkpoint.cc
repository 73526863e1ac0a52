#include "core/formats/checkpoint.h"

#include <algorithm>
#include <regex>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/tensor/dtype.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

bool IsRegularFile(Env* env, const std::string& path) {
  absl::StatusOr<FileInfo> info = env->Stat(path);
  return info.ok() && info->regular;
}

// A shard name from an index must name a file inside the checkpoint directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\\') == std::string::npos;
}

}  // namespace

std::string DetectLayersPrefix(const std::vector<std::string>& names) {
  static const std::regex pattern(R"(^(.*layers\.)\d+\.self_attn\..*)");
  std::smatch match;
  for (const std::string& name : names) {
    if (std::regex_match(name, match, pattern)) return match[1];
  }
  return "model.layers.";
}

bool IsQuantizableLinearWeight(const SafetensorsEntry& entry) {
  return absl::EndsWith(entry.name, ".weight") && entry.shape.size() == 2 &&
         !absl::StrContains(entry.name, "embed_tokens") &&
         !absl::StrContains(entry.name, "lm_head") && ParseDType(entry.dtype).ok();
}

absl::StatusOr<std::unique_ptr<HfCheckpoint>> HfCheckpoint::Open(const std::string& dir,
                                                                 Env* env) {
  absl::StatusOr<FileInfo> dir_info = env->Stat(dir);
  if (!dir_info.ok() && !absl::IsNotFound(dir_info.status())) return dir_info.status();
  if (!dir_info.ok() || !dir_info->directory) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  }
  std::unique_ptr<HfCheckpoint> checkpoint(new HfCheckpoint());
  checkpoint->dir_ = dir;
  checkpoint->env_ = env;
  const std::string index_path = JoinPath(dir, kSafetensorsIndexName);
  absl::StatusOr<std::string> text = env->ReadFile(index_path);
  if (!text.ok() && !absl::IsNotFound(text.status())) return text.status();
  if (text.ok()) {
    const std::string& where = index_path;
    if (!text.ok()) return text.status();
    nlohmann::json index = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    }
    auto map = index.find("weight_map");
    if (map == index.end() || !map->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": weight_map: missing or not an object"));
    }
    std::set<std::string> shards;
    for (const auto& [name, shard] : map->items()) {
      if (!shard.is_string() || !IsPlainFileName(shard.get<std::string>())) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": weight_map[\"", name, "\"]: must be a file name inside the directory"));
      }
      checkpoint->shard_of_[name] = shard.get<std::string>();
      shards.insert(shard.get<std::string>());
    }
    for (const std::string& shard : shards) {
      if (!IsRegularFile(env, JoinPath(dir, shard))) {
        return absl::NotFoundError(
            absl::StrCat(where, ": shard ", shard, " listed in weight_map does not exist"));
      }
    }
    checkpoint->shards_.assign(shards.begin(), shards.end());
    checkpoint->from_index_ = true;
    checkpoint->names_known_ = true;
    return checkpoint;
  }
  if (IsRegularFile(env, JoinPath(dir, kSingleSafetensorsName))) {
    checkpoint->shards_.push_back(kSingleSafetensorsName);
    return checkpoint;
  }
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(dir);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    if (absl::EndsWith(name, ".safetensors") && name.size() > 12 &&
        IsRegularFile(env, JoinPath(dir, name))) {
      checkpoint->shards_.push_back(name);
    }
  }
  std::sort(checkpoint->shards_.begin(), checkpoint->shards_.end());
  if (checkpoint->shards_.empty()) {
    return absl::NotFoundError(absl::StrCat(dir, ": no ", kSafetensorsIndexName, ", ",
                                            kSingleSafetensorsName, " or *.safetensors"));
  }
  return checkpoint;
}

absl::StatusOr<const SafetensorsFile*> HfCheckpoint::Shard(const std::string& shard) {
  if (open_file_ != nullptr && open_name_ == shard) return open_file_.get();
  open_file_.reset();  // one mapping at a time
  open_name_.clear();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(JoinPath(dir_, shard));
  if (!file.ok()) return file.status();
  if (from_index_) {
    // The index is authoritative: every tensor it places here must be here.
    for (const auto& [name, owner] : shard_of_) {
      if (owner == shard && (*file)->Find(name) == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            (*file)->origin(), ": tensor \"", name, "\" is listed in ", kSafetensorsIndexName,
            " but missing from this shard"));
      }
    }
  }
  open_file_ = std::move(*file);
  open_name_ = shard;
  return open_file_.get();
}

absl::Status HfCheckpoint::IndexAllShards() {
  if (names_known_) return absl::OkStatus();
  std::map<std::string, std::string> found;
  for (const std::string& shard : shards_) {
    absl::StatusOr<const SafetensorsFile*> file = Shard(shard);
    if (!file.ok()) return file.status();
    for (const SafetensorsEntry& entry : (*file)->tensors()) {
      auto [it, inserted] = found.emplace(entry.name, shard);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(dir_, ": tensor \"", entry.name,
                                                       "\" appears in both ", it->second,
                                                       " and ", shard));
      }
    }
  }
  shard_of_ = std::move(found);
  names_known_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> HfCheckpoint::TensorNames() {
  if (absl::Status status = IndexAllShards(); !status.ok()) return status;
  std::vector<std::string> names;
  names.reserve(shard_of_.size());
  for (const auto& [name, shard] : shard_of_) names.push_back(name);
  return names;
}

absl::StatusOr<std::string> HfCheckpoint::ShardOf(absl::string_view name) {
  if (absl::Status status = IndexAllShards(); !status.ok()) return status;
  auto it = shard_of_.find(std::string(name));
  if (it == shard_of_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no tensor \"", name, "\""));
  }
  return it->second;
}

absl::StatusOr<std::string> HfCheckpoint::ReadConfigText() const {
  return env_->ReadFile(JoinPath(dir_, "config.json"));
}

absl::StatusOr<ModelConfig> HfCheckpoint::ReadConfig() const {
  absl::StatusOr<std::string> text = ReadConfigText();
  if (!text.ok()) return text.status();
  absl::StatusOr<ModelConfig> config = ParseHfConfig(*text);
  if (!config.ok()) {
    // ParseHfConfig's messages start with "config.json: ".
    return absl::Status(config.status().code(),
                        absl::StrCat(dir_, "/", config.status().message()));
  }
  return config;
}

absl::StatusOr<HfCheckpoint::Tensor> HfCheckpoint::Get(absl::string_view name) {
  absl::StatusOr<std::string> shard = ShardOf(name);
  if (!shard.ok()) return shard.status();
  absl::StatusOr<const SafetensorsFile*> file = Shard(*shard);
  if (!file.ok()) return file.status();
  const SafetensorsEntry* entry = (*file)->Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(
        absl::StrCat((*file)->origin(), ": no tensor \"", name, "\""));
  }
  return Tensor{*file, entry};
}

absl::Status HfCheckpoint::ForEachTensor(
    const std::function<bool(const SafetensorsEntry&)>& filter,
    const std::function<absl::Status(const SafetensorsFile&, const SafetensorsEntry&)>& visit) {
  for (const std::string& shard : shards_) {
    absl::StatusOr<const SafetensorsFile*> file = Shard(shard);
    if (!file.ok()) return file.status();
    for (const SafetensorsEntry& entry : (*file)->tensors()) {
      // With an index, a tensor that also sits in another shard belongs to the one listed.
      if (names_known_) {
        auto owner = shard_of_.find(entry.name);
        if (owner == shard_of_.end() || owner->second != shard) continue;
      }
      if (filter && !filter(entry)) continue;
      absl::Status status = visit(**file, entry);
      (*file)->ReleasePages(entry);
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace caliper
