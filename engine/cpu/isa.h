// The instruction set the CPU kernels of this translation unit are compiled for (Note [CPU kernels
// per instruction set]). Every declaration of engine/cpu/ except threads.h sits in
// evenflow::cpu_backend::EF_CPU_ISA, so that a portable build can hold three copies of the kernels.
#pragma once

// native: the one copy of a -march=native build; baseline, avx2 and avx512: the three copies of a
// portable one (EF_NATIVE=OFF). The build defines it for the kernels and for code that calls them
// directly.
#ifndef EF_CPU_ISA
#define EF_CPU_ISA native
#endif
