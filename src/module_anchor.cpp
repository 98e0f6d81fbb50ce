// Linked into every module library so a module whose sources are still being written links cleanly.
namespace kvcompact::detail {
int module_anchor() { return 0; }
}  // namespace kvcompact::detail
