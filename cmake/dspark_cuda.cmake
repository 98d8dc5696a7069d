# SPDX-License-Identifier: Apache-2.0
# CUDA configuration for dspark: toolkit paths that torch's CMake guesses wrong on pip-installed CUDA wheels,
# architectures, and the CUTLASS/CuTe headers from the nvidia-cutlass wheel.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

# torch's FindCUDA-era config wants these; /usr/local/bin/nvcc is often a shim so derive the root from the
# compiler CMake actually found.
if(NOT CUDA_TOOLKIT_ROOT_DIR)
  set(CUDA_TOOLKIT_ROOT_DIR "${CUDAToolkit_LIBRARY_ROOT}")
endif()
set(ENV{TORCH_CUDA_ARCH_LIST} "")
string(REPLACE ";" " " _archs_space "${DSPARK_CUDA_ARCHS}")
set(_torch_arch_list "")
foreach(_a ${DSPARK_CUDA_ARCHS})
  string(REGEX REPLACE "^([0-9]+)([0-9])(a?)$" "\\1.\\2\\3" _dotted "${_a}")
  list(APPEND _torch_arch_list "${_dotted}")
endforeach()
string(REPLACE ";" "\;" _torch_arch_env "${_torch_arch_list}")
set(ENV{TORCH_CUDA_ARCH_LIST} "${_torch_arch_list}")
set(TORCH_CUDA_ARCH_LIST "${_torch_arch_list}")

# Headers and libraries that the system toolkit lacks but torch's CUDA wheel ships (nvrtc, cusparse, curand, ...).
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
          "import os, nvidia; print(os.path.dirname(list(nvidia.__path__)[0] + '/x'))"
  OUTPUT_VARIABLE DSPARK_NVIDIA_WHEEL_DIR OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
set(DSPARK_NVIDIA_INCLUDE_DIRS "")
if(DSPARK_NVIDIA_WHEEL_DIR)
  file(GLOB _nv_inc_dirs "${DSPARK_NVIDIA_WHEEL_DIR}/*/include")
  list(APPEND DSPARK_NVIDIA_INCLUDE_DIRS ${_nv_inc_dirs})
  if(NOT CUDA_nvrtc_LIBRARY)
    file(GLOB _nvrtc "${DSPARK_NVIDIA_WHEEL_DIR}/*/lib/libnvrtc.so*")
    if(_nvrtc)
      list(GET _nvrtc 0 _nvrtc0)
      set(CUDA_nvrtc_LIBRARY "${_nvrtc0}" CACHE FILEPATH "nvrtc from the nvidia wheels")
    endif()
  endif()
endif()

# CUTLASS / CuTe: from the nvidia-cutlass wheel unless given explicitly.
if(NOT DSPARK_CUTLASS_INCLUDE_DIR)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import os, cutlass_library; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
    OUTPUT_VARIABLE _cutlass_inc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_cutlass_inc AND EXISTS "${_cutlass_inc}/cute/tensor.hpp")
    set(DSPARK_CUTLASS_INCLUDE_DIR "${_cutlass_inc}" CACHE PATH "" FORCE)
  endif()
endif()
if(NOT DSPARK_CUTLASS_INCLUDE_DIR OR NOT EXISTS "${DSPARK_CUTLASS_INCLUDE_DIR}/cute/tensor.hpp")
  message(FATAL_ERROR
    "dspark: CUDA build needs the CUTLASS/CuTe headers. `pip install nvidia-cutlass` (its "
    "cutlass_library/source/include is used), or pass -DDSPARK_CUTLASS_INCLUDE_DIR=/path/to/cutlass/include, "
    "or build CPU-only with DSPARK_ENABLE_CUDA=OFF.")
endif()
message(STATUS "dspark: CUDA kernels for ${DSPARK_CUDA_ARCHS}; CUTLASS at ${DSPARK_CUTLASS_INCLUDE_DIR}")

function(dspark_configure_cuda_target target)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${DSPARK_CUDA_ARCHS}")
  target_include_directories(${target} SYSTEM PRIVATE ${DSPARK_CUTLASS_INCLUDE_DIR} ${DSPARK_NVIDIA_INCLUDE_DIRS})
  target_compile_definitions(${target} PRIVATE DSPARK_WITH_CUDA DSPARK_CUDA_ARCHS_STR="${DSPARK_CUDA_ARCHS}")
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -O3 -lineinfo>)
endfunction()
