#include "tf_adapter/live_variables.h"

#include <algorithm>

#include "tensorflow/core/common_runtime/dma_helper.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tsl/platform/logging.h"

namespace lms {

bool LiveVariables::IsXlaKernel(const tensorflow::OpKernel& kernel) {
  const absl::string_view op = kernel.type_string_view();
  if (op == "XlaLaunch" || op == "XlaLaunchV2" || op == "_XlaRun") return true;
  const auto& attrs = kernel.def().attr();
  const auto it = attrs.find("_XlaMustCompile");
  return it != attrs.end() && it->second.b();
}

void LiveVariables::Add(const void* data, tensorflow::Var* variable) {
  variable->Ref();
  std::lock_guard<std::mutex> lock(mu_);
  held_[data].variables.push_back(variable);
  registered_.fetch_add(1, std::memory_order_relaxed);
}

bool LiveVariables::Remove(const void* data, tensorflow::Var* variable) {
  bool decide = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = held_.find(data);
    if (it == held_.end()) return false;
    std::vector<tensorflow::Var*>& variables = it->second.variables;
    auto found = std::find(variables.begin(), variables.end(), variable);
    if (found == variables.end()) return false;
    variables.erase(found);
    registered_.fetch_sub(1, std::memory_order_relaxed);
    if (variables.empty()) {
      decide = it->second.free_deferred;
      held_.erase(it);
    }
  }
  bool still_held = false;
  if (decide) {
    // Without the variable's lock: the kernel's context may end while its
    // launch still holds it (taking it here deadlocked the failed step).
    still_held = tensorflow::DMAHelper::base(variable->tensor()) == data;
  }
  variable->Unref();
  if (!still_held) return decide;
  if (dropped_.fetch_add(1, std::memory_order_relaxed) == 0) {
    LOG(WARNING) << "tensorflow_lms_allocator: an XLA kernel freed the buffer of a variable "
                    "that still holds it (TensorFlow's error path: Note [XLA frees live "
                    "variables on its error path] in live_variables.h). LMS keeps the memory "
                    "for the variable, whose value stays intact; TensorFlow's own allocator "
                    "aborts here (said once per process)";
  }
  return false;
}

bool LiveVariables::DeferFreeSlow(const void* data) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(data);
  if (it == held_.end()) return false;
  it->second.free_deferred = true;
  return true;
}

}  // namespace lms
