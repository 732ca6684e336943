/* cupti_callbacks.h includes the CUDA runtime's builtin_types.h; nothing tuiprof's injection
 * library compiles needs a type from it. */
