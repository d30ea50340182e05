#include "server/recipe_availability.h"

namespace teserve {
namespace server {

std::vector<v1::RecipeAvailability> RecipeAvailabilities(const DeviceFacts& facts) {
  std::vector<v1::RecipeAvailability> out;
  for (const recipes::GemmPlan& plan : recipes::PlanGemms(facts)) {
    v1::RecipeAvailability& entry = out.emplace_back();
    entry.set_recipe(plan.recipe);
    switch (plan.execution) {
      case recipes::GemmExecution::kNative: entry.set_availability(v1::NATIVE); break;
      case recipes::GemmExecution::kEmulated: entry.set_availability(v1::EMULATED); break;
      case recipes::GemmExecution::kUnavailable: entry.set_availability(v1::UNAVAILABLE); break;
    }
    entry.set_reason(plan.reason);
  }
  return out;
}

}  // namespace server
}  // namespace teserve
