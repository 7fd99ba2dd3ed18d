// A deliberately broken core-level file for layering_link_fires (tests/layering/CMakeLists.txt):
// it calls the model layer (block_plan.h's LNS scale) while its library links only
// core, so the layer link check must fail to link it.
#include "lns/model/block_plan.h"

namespace lns {

float core_code_calling_the_model(int layer) { return lns_scale(layer); }

}  // namespace lns
