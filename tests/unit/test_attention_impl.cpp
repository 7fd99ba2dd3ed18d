// The once-per-model choice of the attention implementation (src/core/attention_impl.cpp):
// the flag's values, Auto's rule, and the one-line errors for impossible requests.
#include <gtest/gtest.h>

#include "lns/core/errors.h"
#include "lns/core/ops.h"

namespace lns {
namespace {

TEST(AttentionImpl, ParsesTheFlagAndNamesBadValues) {
  for (AttentionImpl a : {AttentionImpl::Auto, AttentionImpl::Fused, AttentionImpl::Materialized, AttentionImpl::Cudnn,
                          AttentionImpl::CudnnNondeterministic})
    EXPECT_EQ(parse_attention_impl(attention_impl_name(a)), a);
  try {
    parse_attention_impl("flash");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "--attention=flash is not an attention implementation; expected auto, fused, cudnn, "
                 "cudnn_nondeterministic or materialized");
  }
}

TEST(AttentionImpl, AutoTakesFusedWhereTheKernelsApply) {
  EXPECT_EQ(choose_attention_impl(AttentionImpl::Auto, Device::CUDA, 64), AttentionImpl::Fused);
  EXPECT_EQ(choose_attention_impl(AttentionImpl::Auto, Device::CUDA, 128), AttentionImpl::Fused);
  for (int64_t d : {16, 32, 80, 96, 256})
    EXPECT_EQ(choose_attention_impl(AttentionImpl::Auto, Device::CUDA, d), AttentionImpl::Materialized) << d;
  EXPECT_EQ(choose_attention_impl(AttentionImpl::Auto, Device::CPU, 64), AttentionImpl::Materialized);
  EXPECT_EQ(choose_attention_impl(AttentionImpl::Materialized, Device::CUDA, 64), AttentionImpl::Materialized);
  EXPECT_EQ(choose_attention_impl(AttentionImpl::Fused, Device::CUDA, 128), AttentionImpl::Fused);
  // the CPU has one attention whatever the flag says (a GPU flagfile still runs there)
  for (AttentionImpl a : {AttentionImpl::Auto, AttentionImpl::Fused, AttentionImpl::Materialized, AttentionImpl::Cudnn})
    EXPECT_EQ(choose_attention_impl(a, Device::CPU, 96), AttentionImpl::Materialized);
  // cuDNN's head dims: multiples of 8 up to 128, wider than the fused kernels'
  for (int64_t d : {8, 32, 64, 72, 96, 128}) {
    EXPECT_EQ(choose_attention_impl(AttentionImpl::Cudnn, Device::CUDA, d), AttentionImpl::Cudnn) << d;
    EXPECT_EQ(choose_attention_impl(AttentionImpl::CudnnNondeterministic, Device::CUDA, d),
              AttentionImpl::CudnnNondeterministic);
  }
  EXPECT_TRUE(is_cudnn(AttentionImpl::Cudnn) && is_cudnn(AttentionImpl::CudnnNondeterministic));
  EXPECT_FALSE(is_cudnn(AttentionImpl::Fused) || is_cudnn(AttentionImpl::Auto));
  EXPECT_EQ(attention_library(AttentionImpl::Fused), "");  // the project's own kernels load nothing
}

TEST(AttentionImpl, FusedForAShapeItDoesNotTakeIsAUserError) {
  try {
    choose_attention_impl(AttentionImpl::Fused, Device::CUDA, 96);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--attention=fused takes head dims 64 and 128"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("got 96"), std::string::npos) << e.what();
  }
}

TEST(AttentionImpl, CudnnForAHeadDimItDoesNotTakeIsAUserError) {
  for (AttentionImpl a : {AttentionImpl::Cudnn, AttentionImpl::CudnnNondeterministic})
    for (int64_t d : {36, 136, 256}) try {
        choose_attention_impl(a, Device::CUDA, d);
        FAIL() << "no error for " << d;
      } catch (const UserError& e) {
        EXPECT_EQ(std::string(e.what()), std::string("--attention=") + attention_impl_name(a) +
                                             " takes head dims that are multiples of 8 up to 128 "
                                             "(hidden_size / num_heads), got " + std::to_string(d) +
                                             "; use --attention=materialized or auto");
      }
}

}  // namespace
}  // namespace lns
