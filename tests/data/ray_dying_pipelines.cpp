// A Ray task library for test_ray whose workers die on purpose: the description
// "die <k> <folder> <pipeline>" kills the worker process (SIGKILL, as the kernel's OOM killer would)
// the first k times a worker builds the pipeline, counting across workers and nodes' processes with
// one file per attempt in <folder>, then makes the programs' <pipeline> (apps/common/pipelines.h).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <sstream>
#include <string>

#include "apps/common/pipelines.h"
#include "data/ray/make_pipeline.h"
#include "evenflow/engine/error.h"

evenflow::data::Pipeline evenflow::data::make_ray_pipeline(const std::string& description) {
  std::istringstream in(description);
  std::string word, folder;
  int deaths = 0;
  in >> word >> deaths >> folder;
  EF_CHECK(word == "die" && !folder.empty(), "ray_dying_pipelines: not \"die <k> <folder> <pipeline>\": ", description);
  int attempt = 0;
  for (;; ++attempt) {
    const std::string file = folder + "/attempt-" + std::to_string(attempt);
    const int fd = ::open(file.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd >= 0) {
      ::close(fd);
      break;
    }
    EF_CHECK(errno == EEXIST, "ray_dying_pipelines: cannot create ", file, ": ", std::strerror(errno));
  }
  if (attempt < deaths) ::raise(SIGKILL);
  in >> std::ws;
  return evenflow::apps::make_pipeline(std::string(std::istreambuf_iterator<char>(in), {}));
}
