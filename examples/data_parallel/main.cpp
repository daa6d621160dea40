// The README's data-parallel example, whole: a FashionMNIST classifier trained data-parallel the way
// a PyTorch DDP user trains one -- wrap the model, a loss on every device, an optimizer, a loader --
// and saved and resumed with one call. Run under mpirun it spans every process's devices with no
// change. scripts/test_install.sh builds it against an installed evenflow and checks that two
// devices train what one does, and that a resumed run continues exactly.
//
//   data_parallel [devices] [steps] [checkpoint] [data folder]
//   data_parallel cpu:2 20 run.safetensors      # 20 steps in all; resumes from run.safetensors if it exists
#include <evenflow/evenflow.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

namespace ef = evenflow;
namespace nn = evenflow::nn;
namespace par = evenflow::parallel;

int main(int argc, char** argv) try {
  const std::string devices = argc > 1 ? argv[1] : "cpu:2";
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 100;
  const std::string checkpoint = argc > 3 ? argv[3] : "data_parallel.safetensors";
  const std::string data = argc > 4 ? argv[4] : ef::data::kFashionMnistRoot;
  const nn::ModuleOptions o{.dtype = ef::kFloat64};  // float64: so that 1 and N devices compare to 1e-10

  ef::manual_seed(0);
  auto net = std::make_shared<nn::Sequential>(nn::Flatten(), nn::Linear(28 * 28, 128, true, o), nn::ReLU(),
                                              nn::Dropout(0.2), nn::Linear(128, 10, true, o));
  par::DataParallelModel model(net, par::devices(devices));                     // replicas on every device
  par::DataParallelCriterion criterion(model, ef::losses::CrossEntropyLoss{});  // the whole batch's loss
  par::ReplicatedOptimizer<ef::optim::Adam> opt(model, ef::optim::AdamOptions{.lr = 1e-3});
  par::TrainingState state({{"", model, opt}});  // model, optimizer, generators, position
  auto train_set = std::make_shared<ef::data::FashionMNIST>(ef::data::Split::Train, data);
  ef::data::DataLoader loader(
      train_set,
      {.batch_size = 64, .shuffle = true, .seed = 0, .batch_part = model.batch_part()});  // this process's rows

  int64_t step = 0;
  if (std::filesystem::exists(checkpoint)) step = state.load(checkpoint).progress.step;
  while (step < steps) {
    for (ef::data::Batch& b : loader.after(step)) {  // one batch a step: continue after `step` batches
      // b.rows: which rows of the job's batch this process read, so scatter needs no collective.
      const ef::Tensor loss =
          criterion(model(model.scatter(b.images.to(ef::kFloat64), b.rows)), model.scatter(b.labels, b.rows));
      opt.zero_grad();
      loss.backward();  // gradients all-reduced while backward runs
      opt.step();       // every replica steps; replicas stay identical
      if (++step % 5 == 0) std::printf("step %3lld loss %.17g\n", static_cast<long long>(step), loss.item());
      if (step == steps) break;
    }
  }
  // Process 0 writes it; any device or process count resumes it.
  state.save(checkpoint, {.step = step, .epoch = loader.position().epoch});
  model.check_replicas();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "data_parallel: error: %s\n", e.what());
  return 1;
}
