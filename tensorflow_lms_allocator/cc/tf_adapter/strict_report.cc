#include "tf_adapter/strict_report.h"

#include <cstdio>

namespace lms {

std::string FormatUnpinnedTouches(const std::vector<UnpinnedTouch>& touches) {
  std::string out;
  char line[160];
  for (const UnpinnedTouch& t : touches) {
    std::snprintf(line, sizeof(line), "%#lx %lu %#lx %lu ",
                  static_cast<unsigned long>(t.address),
                  static_cast<unsigned long>(t.allocation_id),
                  static_cast<unsigned long>(t.allocation_address),
                  static_cast<unsigned long>(t.allocation_bytes));
    out += line;
    out += t.label.empty() ? "-" : t.label;
    out += "\n";
  }
  return out;
}

}  // namespace lms
