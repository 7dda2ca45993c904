// `dflash report RUN_DIR`: one self-contained HTML page (inline SVG, no
// scripts, no external files) with the loss, tau and per-slot accuracy
// curves from RUN/metrics.jsonl, the run's config (RUN/config.toml) and its
// preflight verdict (RUN/preflight.json).
#pragma once

#include <string>

namespace dflash::train {

// Writes RUN_DIR/report.html (atomically) and returns its path; errors name
// the file and line of anything malformed.
std::string write_report(const std::string& run_dir);

}  // namespace dflash::train
