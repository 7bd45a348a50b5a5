# What `cmake --install` puts under the prefix (docs/ARCHITECTURE.md, "Installed files"):
#   bin/deltacast
#   lib/<multiarch>/libdeltacast.so.0 (SONAME; the C ABI and the C++ API of the installed headers)
#   include/deltacast/...           (the public headers of common, codec, io, runtime, transport, embed)
#   lib/<multiarch>/pkgconfig/deltacast.pc
#   lib/<multiarch>/cmake/deltacast/ (find_package(deltacast): deltacast::deltacast)
#   the Python package (python/CMakeLists.txt), the systemd units, the docs.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# libdeltacast: the static libraries of the layers a worker or publisher needs, whole. They are
# compiled with hidden visibility; what the installed headers declare is exported (each opens
# with `#pragma GCC visibility push(default)`), the rest stays inside.
# Their objects make the library; linking the archives too brings in their own dependencies
# (ZeroMQ, libuv, Protobuf, libsodium, zstd, xxHash, spdlog), and nothing of the archives twice.
set(DELTACAST_LIBRARY_LAYERS deltacast_embed deltacast_transport deltacast_wire deltacast_wire_proto deltacast_runtime deltacast_io deltacast_codec
    deltacast_common)
add_library(deltacast_shared SHARED ${PROJECT_SOURCE_DIR}/embed/src/library.cc)
foreach(layer ${DELTACAST_LIBRARY_LAYERS})
  target_sources(deltacast_shared PRIVATE $<TARGET_OBJECTS:${layer}>)
endforeach()
target_compile_definitions(deltacast_shared PRIVATE DELTACAST_VERSION_STRING="${PROJECT_VERSION}")
target_link_libraries(deltacast_shared PRIVATE ${DELTACAST_LIBRARY_LAYERS})
target_include_directories(deltacast_shared INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(deltacast_shared INTERFACE cxx_std_20)
set_target_properties(deltacast_shared PROPERTIES OUTPUT_NAME deltacast EXPORT_NAME deltacast VERSION ${PROJECT_VERSION}
                                                  SOVERSION ${PROJECT_VERSION_MAJOR} LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
# Nothing undefined: every symbol the library needs comes from a library it names.
target_link_options(deltacast_shared PRIVATE -Wl,--no-undefined -Wl,--as-needed)

install(TARGETS deltacast RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT bin)
install(TARGETS deltacast_shared EXPORT deltacast_targets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev)
foreach(layer common codec io runtime transport embed)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/include/deltacast DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev
          FILES_MATCHING PATTERN "*.h")
endforeach()

# deltacast.pc finds the prefix from where it lies, so it holds wherever the tree is installed
# (--prefix at install time, a package's /usr).
file(RELATIVE_PATH DELTACAST_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" DELTACAST_PC_TO_PREFIX "${DELTACAST_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/deltacast.pc.in ${CMAKE_BINARY_DIR}/deltacast.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/deltacast.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

install(EXPORT deltacast_targets NAMESPACE deltacast:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/deltacast COMPONENT dev
        FILE deltacastTargets.cmake)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/deltacastConfig.cmake.in ${CMAKE_BINARY_DIR}/deltacastConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/deltacast)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/deltacastConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/deltacastConfig.cmake ${CMAKE_BINARY_DIR}/deltacastConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/deltacast COMPONENT dev)

install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT bin)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT bin)

# systemd units for a relay or worker per config file (/etc/deltacast/NAME.json), and the user
# they run as.
# They name the executable by its installed path, known at install time (--prefix, a package's
# /usr); made in a folder of their own per destination, so that installs side by side (a
# package being built, a test's prefix) do not take each other's.
foreach(role relay worker)
  install(CODE "
    set(CMAKE_INSTALL_FULL_BINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
    set(CMAKE_INSTALL_FULL_DOCDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DOCDIR}\")
    string(MD5 destination \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}\")
    set(unit \"${CMAKE_BINARY_DIR}/systemd/\${destination}/deltacast-${role}@.service\")
    configure_file(\"${PROJECT_SOURCE_DIR}/packaging/systemd/deltacast-${role}@.service.in\" \"\${unit}\" @ONLY)
    file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/lib/systemd/system\" TYPE FILE FILES \"\${unit}\")" COMPONENT bin)
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/packaging/systemd/deltacast.sysusers.conf DESTINATION lib/sysusers.d RENAME deltacast.conf
        COMPONENT bin)

# For operators: a Grafana dashboard and Prometheus alert rules over the nodes' metrics.
install(FILES ${PROJECT_SOURCE_DIR}/packaging/monitoring/deltacast-dashboard.json ${PROJECT_SOURCE_DIR}/packaging/monitoring/deltacast-alerts.yml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/deltacast/monitoring COMPONENT bin)
