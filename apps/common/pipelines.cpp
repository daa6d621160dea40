// The descriptions are "key=value" lines, the first naming the pipeline; paths are made absolute,
// because a Ray worker runs elsewhere.
#include "apps/common/pipelines.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include "apps/segment/segmentation.h"
#include "evenflow/data/fashion_mnist.h"
#include "evenflow/engine/error.h"

namespace evenflow::apps {

namespace {

std::string absolute(const std::string& path) {
  return std::filesystem::absolute(path).lexically_normal().string();
}

std::map<std::string, std::string> parse(const std::string& description) {
  std::map<std::string, std::string> fields;
  std::istringstream in(description);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    EF_CHECK(eq != std::string::npos && eq > 0, "pipeline description: \"", line, "\" is not key=value");
    fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return fields;
}

const std::string& field(const std::map<std::string, std::string>& f, const std::string& key) {
  const auto it = f.find(key);
  EF_CHECK(it != f.end(), "pipeline description: no ", key, "=");
  return it->second;
}

int64_t number(const std::map<std::string, std::string>& f, const std::string& key) {
  const std::string& v = field(f, key);
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  EF_CHECK(used == v.size() && used > 0, "pipeline description: ", key, "=", v, " is not a number");
  return n;
}

}  // namespace

std::string classify_pipeline(const std::string& data, bool augment) {
  return "pipeline=classify\ndata=" + absolute(data) + "\naugment=" + (augment ? "on" : "off");
}

std::string segment_pipeline(const std::string& data, int64_t size, int64_t canvas, uint64_t seed, bool augment) {
  return "pipeline=segment\ndata=" + absolute(data) + "\nsize=" + std::to_string(size) +
         "\ncanvas=" + std::to_string(canvas) + "\nseed=" + std::to_string(seed) +
         "\naugment=" + (augment ? "on" : "off");
}

data::Pipeline make_pipeline(const std::string& description) {
  const auto f = parse(description);
  const std::string& name = field(f, "pipeline");
  const std::string& augment = field(f, "augment");
  EF_CHECK(augment == "on" || augment == "off", "pipeline description: augment=", augment, " is not on or off");
  data::Pipeline p;
  if (name == "classify") {
    p.dataset = std::make_shared<data::FashionMNIST>(data::Split::Train, field(f, "data"));
    if (augment == "on")
      p.transforms = {std::make_shared<data::RandomAffine>(10.0, 0.0, 0.1), std::make_shared<data::RandomCrop>(28, 2),
                      std::make_shared<data::RandomHorizontalFlip>()};
  } else if (name == "segment") {
    const int64_t canvas = number(f, "canvas");
    p.dataset =
        std::make_shared<segment::CanvasSet>(data::load_fashion_mnist(data::Split::Train, field(f, "data")),
                                             number(f, "size"), canvas, static_cast<uint64_t>(number(f, "seed")), 0);
    const int64_t background = segment::kBackground;
    if (augment == "on")
      p.transforms = {std::make_shared<data::RandomAffine>(10.0, 0.0, 0.1, background),
                      std::make_shared<data::RandomCrop>(canvas, 4, background),
                      std::make_shared<data::RandomHorizontalFlip>()};
  } else {
    EF_ERROR("pipeline description: unknown pipeline \"", name, "\" (classify or segment)");
  }
  return p;
}

std::shared_ptr<const data::RayBatches> connect_ray(const std::string& address, const std::string& description) {
  if (address.empty()) return nullptr;
  auto ray = std::make_shared<const data::RayBatches>(data::RayOptions{.address = address, .pipeline = description});
  std::printf("training batches made on the Ray cluster at %s\n", ray->options().address.c_str());
  std::fflush(stdout);
  return ray;
}

}  // namespace evenflow::apps
