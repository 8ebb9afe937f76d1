#include "engine/trace_recorder.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

namespace lms {
namespace {

constexpr char kMagic[8] = {'L', 'M', 'S', 'T', 'R', 'A', 'C', 'E'};
constexpr char kEndMagic[8] = {'L', 'M', 'S', 'T', 'R', 'E', 'N', 'D'};
constexpr uint32_t kVersion = 1;

struct TraceRecord {
  uint64_t time_ns;
  uint64_t address;
  uint64_t bytes;
  uint64_t unit_id;
  uint32_t thread;
  uint16_t op;
  uint8_t event;
  uint8_t flags;
};
static_assert(sizeof(TraceRecord) == 40, "Note [Access trace format]");
constexpr size_t kHeaderBytes = 16;

uint32_t ThreadId() {
  thread_local const uint32_t id = static_cast<uint32_t>(syscall(SYS_gettid));
  return id;
}

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out->append(escaped);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back('"');
}

}  // namespace

Status TraceRecorder::Open(const std::string& path, uint64_t max_bytes,
                           std::unique_ptr<TraceRecorder>* recorder) {
  if (max_bytes < kHeaderBytes + sizeof(TraceRecord)) {
    return InvalidArgument("trace size cap of " + std::to_string(max_bytes) +
                           " bytes cannot hold one event (" +
                           std::to_string(kHeaderBytes + sizeof(TraceRecord)) + " bytes)");
  }
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return Internal("cannot create the trace file " + path + ": " + std::strerror(errno));
  }
  // A large buffer keeps a record's cost to a copy (the engine's lock is held).
  std::setvbuf(file, nullptr, _IOFBF, 1 << 20);
  const uint32_t header[2] = {kVersion, static_cast<uint32_t>(sizeof(TraceRecord))};
  std::fwrite(kMagic, 1, sizeof(kMagic), file);
  std::fwrite(header, 1, sizeof(header), file);
  recorder->reset(new TraceRecorder(file, path, (max_bytes - kHeaderBytes) / sizeof(TraceRecord)));
  return Status::Ok();
}

TraceRecorder::TraceRecorder(std::FILE* file, std::string path, uint64_t max_records)
    : file_(file), path_(std::move(path)), max_records_(max_records),
      start_(std::chrono::steady_clock::now()) {}

TraceRecorder::~TraceRecorder() {
  if (file_ != nullptr) std::fclose(file_);
}

uint16_t TraceRecorder::OpIndex(const char* op) {
  if (op == nullptr || *op == '\0') return 0;
  auto it = op_index_.find(op);
  if (it != op_index_.end()) return it->second;
  if (ops_.size() >= UINT16_MAX) return 0;  // more distinct ops than the format holds
  ops_.emplace_back(op);
  const uint16_t index = static_cast<uint16_t>(ops_.size());
  op_index_.emplace(ops_.back(), index);
  return index;
}

void TraceRecorder::Record(TraceEvent event, uintptr_t address, uint64_t bytes,
                           uint64_t unit_id, const char* op, uint8_t flags) {
  if (events_ >= max_records_) {
    ++dropped_;
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  const TraceRecord r = {
      static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - start_).count()),
      address, bytes, unit_id, ThreadId(), OpIndex(op), static_cast<uint8_t>(event), flags};
  if (std::fwrite(&r, sizeof(r), 1, file_) != 1) write_failed_ = true;
  ++events_;
}

Status TraceRecorder::Finish(TraceSummary* summary) {
  std::string json = "{\"ops\": [";
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (i > 0) json += ", ";
    AppendJsonString(ops_[i], &json);
  }
  json += "], \"events\": " + std::to_string(events_) +
          ", \"dropped\": " + std::to_string(dropped_) +
          ", \"max_bytes\": " + std::to_string(kHeaderBytes + max_records_ * sizeof(TraceRecord)) +
          "}";
  const uint64_t length = json.size();
  std::fwrite(json.data(), 1, json.size(), file_);
  std::fwrite(&length, sizeof(length), 1, file_);
  std::fwrite(kEndMagic, 1, sizeof(kEndMagic), file_);
  const bool failed = write_failed_ || std::ferror(file_) != 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (summary != nullptr) {
    *summary = {events_, dropped_, kHeaderBytes + max_records_ * sizeof(TraceRecord), path_};
  }
  if (failed || !closed) return Internal("writing the trace file " + path_ + " failed");
  return Status::Ok();
}

}  // namespace lms
