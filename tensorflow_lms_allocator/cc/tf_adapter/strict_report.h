// The strict-mode report: the unpinned touches the engine recorded, as the
// text tf_lms_unpinned_touches() hands to Python (lms.unpinned_touches()
// parses it). One line per touch:
//   <address> <allocation id> <allocation address> <allocation bytes> <label>
// addresses in hex with 0x, the others in decimal, "-" for an empty label.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_STRICT_REPORT_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_STRICT_REPORT_H_

#include <string>
#include <vector>

#include "engine/strict_monitor.h"

namespace lms {

std::string FormatUnpinnedTouches(const std::vector<UnpinnedTouch>& touches);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_STRICT_REPORT_H_
