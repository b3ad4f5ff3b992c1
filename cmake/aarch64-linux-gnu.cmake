# Cross build for ARM64 (Debian's gcc-aarch64-linux-gnu and the arm64
# -dev packages of multiarch); tests run under qemu-aarch64 (scripts/arm64.sh).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
# The programs run on multiarch's libc6:arm64 (/lib/ld-linux-aarch64.so.1 and
# /lib/aarch64-linux-gnu): no -L /usr/aarch64-linux-gnu, whose loader would
# mix with that libc through the host's ld.so.cache (threads then hang).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
