// CRC-32 as zlib computes it (IEEE 802.3, reflected; crc32_z(0, data, size)), for the records a store packs with
// their checksum: every read checks one, so it runs on the cores beside each decode.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fastload {

// zlib's crc32_z(0, data, size), with carry-less multiplies where the CPU has them (named apart from zlib's crc32,
// which a zlib built with Z_PREFIX turns into a macro).
uint32_t crc32_ieee(const uint8_t* data, size_t size);

}  // namespace fastload
