// `dflash prepare`: chat data through the target's tokenizer and chat
// template (docs/CHAT_DATA.md). The work is Python (transformers renders the
// template, python/dflash/prepare.py); this runs that module with the torch
// environment's python, this checkout's python/ first on its path. The
// same python runs `dflash features --engine transformers`.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace dflash::cli {

std::string torch_python() {
  const char* env = std::getenv("DFLASH_PYTHON");
  return env && *env ? env : DFLASH_PYTHON;
}

std::string python_dir() { return DFLASH_PYTHON_DIR; }

int cmd_prepare(const std::vector<std::string>& args) {
  const std::string python = torch_python();
  const char* path = std::getenv("PYTHONPATH");
  const std::string pythonpath =
      std::string(DFLASH_PYTHON_DIR) + (path && *path ? std::string(":") + path : "");
  setenv("PYTHONPATH", pythonpath.c_str(), 1);
  std::vector<std::string> argv = {python, "-m", "dflash.prepare"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c;
  for (std::string& a : argv) c.push_back(a.data());
  c.push_back(nullptr);
  if (python.empty()) {
    std::fprintf(stderr,
                 "dflash prepare: no python with transformers configured (set DFLASH_PYTHON, or "
                 "run ci/bootstrap.sh, which makes the torch environment)\n");
    return 1;
  }
  execv(python.c_str(), c.data());
  std::fprintf(stderr, "dflash prepare: cannot run %s: %s (ci/bootstrap.sh makes it)\n",
               python.c_str(), std::strerror(errno));
  return 1;
}

}  // namespace dflash::cli
