# SPDX-License-Identifier: Apache-2.0
# CUDA configuration for dspark: toolkit paths that torch's CMake guesses wrong on pip-installed CUDA wheels,
# architectures, and the CUTLASS/CuTe headers from the nvidia-cutlass wheel. Included from CMakeLists.txt
# before find_package(Torch), which reads CUDA_TOOLKIT_ROOT_DIR, CUDA_nvrtc_LIBRARY and TORCH_CUDA_ARCH_LIST.
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)

# Architectures are set per target (dspark_configure_cuda_target). torch's CMake ignores (and warns about) a
# defined CMAKE_CUDA_ARCHITECTURES, so drop the default enable_language(CUDA) put there.
unset(CMAKE_CUDA_ARCHITECTURES)
unset(CMAKE_CUDA_ARCHITECTURES CACHE)

# Headers and libraries that the system toolkit lacks but torch's CUDA wheel ships (nvrtc, cusparse, curand,
# ...): site-packages/nvidia/<cuXX>/{include,lib}. Found before find_package(CUDAToolkit), which would otherwise
# cache CUDA_nvrtc_LIBRARY as NOTFOUND.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import nvidia, sys; sys.stdout.write(list(nvidia.__path__)[0])"
  OUTPUT_VARIABLE DSPARK_NVIDIA_WHEEL_DIR OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
set(DSPARK_NVIDIA_INCLUDE_DIRS "")
if(DSPARK_NVIDIA_WHEEL_DIR AND IS_DIRECTORY "${DSPARK_NVIDIA_WHEEL_DIR}")
  file(GLOB _nv_inc_dirs LIST_DIRECTORIES true "${DSPARK_NVIDIA_WHEEL_DIR}/*/include")
  list(APPEND DSPARK_NVIDIA_INCLUDE_DIRS ${_nv_inc_dirs})
  if(NOT CUDA_nvrtc_LIBRARY OR NOT EXISTS "${CUDA_nvrtc_LIBRARY}")
    file(GLOB _nvrtc "${DSPARK_NVIDIA_WHEEL_DIR}/*/lib/libnvrtc.so.[0-9]*")
    if(_nvrtc)
      list(SORT _nvrtc)
      list(GET _nvrtc 0 _nvrtc0)
      set(CUDA_nvrtc_LIBRARY "${_nvrtc0}" CACHE FILEPATH "nvrtc from the nvidia wheels" FORCE)
    endif()
  endif()
endif()

find_package(CUDAToolkit REQUIRED)
# torch's FindCUDA-era config wants the root; /usr/local/bin/nvcc is often a shim, so derive it from the
# toolkit the compiler belongs to rather than from the shim's directory.
if(NOT CUDA_TOOLKIT_ROOT_DIR)
  if(CMAKE_CUDA_COMPILER_TOOLKIT_ROOT)
    set(CUDA_TOOLKIT_ROOT_DIR "${CMAKE_CUDA_COMPILER_TOOLKIT_ROOT}")
  else()
    set(CUDA_TOOLKIT_ROOT_DIR "${CUDAToolkit_LIBRARY_ROOT}")
  endif()
endif()
if(NOT CUDA_nvrtc_LIBRARY OR NOT EXISTS "${CUDA_nvrtc_LIBRARY}")
  message(FATAL_ERROR
    "dspark: libnvrtc was found neither in the CUDA toolkit (${CUDA_TOOLKIT_ROOT_DIR}) nor in the nvidia "
    "wheels next to torch (${DSPARK_NVIDIA_WHEEL_DIR}); torch's CMake config links it. Pass "
    "-DCUDA_nvrtc_LIBRARY=/path/to/libnvrtc.so.")
endif()

# torch builds gencode flags from TORCH_CUDA_ARCH_LIST (dotted: 8.0;9.0a); without it, every architecture
# torch itself was built for.
set(_torch_arch_list "")
foreach(_a ${DSPARK_CUDA_ARCHS})
  string(REGEX REPLACE "^([0-9]+)([0-9])([af]?)$" "\\1.\\2\\3" _dotted "${_a}")
  list(APPEND _torch_arch_list "${_dotted}")
endforeach()
set(ENV{TORCH_CUDA_ARCH_LIST} "${_torch_arch_list}")
set(TORCH_CUDA_ARCH_LIST "${_torch_arch_list}")

message(STATUS "dspark: CUDA kernels for ${DSPARK_CUDA_ARCHS} (TORCH_CUDA_ARCH_LIST ${_torch_arch_list}); "
               "toolkit ${CUDA_TOOLKIT_ROOT_DIR}; nvrtc ${CUDA_nvrtc_LIBRARY}; CUTLASS at ${DSPARK_CUTLASS_INCLUDE_DIR}")

function(dspark_configure_cuda_target target)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${DSPARK_CUDA_ARCHS}")
  target_include_directories(${target} SYSTEM PRIVATE ${DSPARK_CUTLASS_INCLUDE_DIR} ${DSPARK_NVIDIA_INCLUDE_DIRS})
  # The arch list keeps its ';' separators inside the string literal (escaped so CMake does not split it).
  string(REPLACE ";" "\\;" _archs_literal "${DSPARK_CUDA_ARCHS}")
  target_compile_definitions(${target} PRIVATE DSPARK_WITH_CUDA "DSPARK_CUDA_ARCHS_STR=\"${_archs_literal}\"")
  # Shared math (include/dspark) spells out every fused op with intrinsics, so nvcc's default FMA contraction
  # only touches kernel-local arithmetic (e.g. dot products), never the bit-exact CPU/CUDA paths.
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -O3 -lineinfo -Xcompiler=-ffp-contract=off>)
endfunction()
