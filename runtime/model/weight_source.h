// Where a rank's weight slices come from: a checkpoint on disk, or a seeded random initialisation
// (a GPT-3-shaped config with no weights). The model loader asks for slices by HF GPT-2 tensor
// name (without the "transformer." prefix), e.g. "h.3.mlp.c_fc.weight"; shapes are the HF ones
// (Conv1D weights are [in, out]).
// Threading: read-only after construction; safe to call from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "runtime/model/checkpoint.h"
#include "runtime/model/model_config.h"

namespace ltm {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const ModelConfig& config() const = 0;
  // The whole tensor as f32 in host memory that lives as long as this source, or nullptr when it
  // must be read (converted or copied) with read_f32.
  virtual const float* f32_in_place(std::string_view name) const = 0;
  // Copies rows x cols of `slice` (row-major) into out as f32. Rows outside the tensor are an error
  // of the caller (LTM_ASSERT).
  virtual void read_f32(std::string_view name, const SliceSpec& slice, float* out) const = 0;
  // Bytes of tensor data read or handed out in place so far.
  virtual uint64_t bytes_read() const = 0;
  virtual std::string describe() const = 0;  // "checkpoint DIR (F16)" / "random (seed 1)"
};

// A checkpoint folder (config.json + safetensors). The source keeps the mapping alive.
std::unique_ptr<WeightSource> make_checkpoint_source(std::shared_ptr<const Checkpoint> checkpoint,
                                                     std::string dir);

// Seeded random weights for `config`: every element is a pure function of (seed, tensor name,
// row, col), so each rank can make only its own slice and every parallel layout sees the same
// model. Weights ~ N(0, std), LayerNorm gains 1 and biases 0 (GPT-2's initialisation).
std::unique_ptr<WeightSource> make_random_source(const ModelConfig& config, uint64_t seed,
                                                 float std);

}  // namespace ltm
