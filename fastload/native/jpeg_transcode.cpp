// See jpeg_transcode.h. Same setjmp discipline as jpeg_decoder.cpp: both libjpeg structs and the setjmp live
// in one frame, nothing in that frame has a destructor, and what is read after a longjmp is volatile.
#include "jpeg_transcode.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <jpeglib.h>
#include <jerror.h>

#include "jpeg_errors.h"

namespace fastload {

using namespace detail;

int64_t choose_restart_interval(int64_t mcus_per_row, int64_t mcu_w) {
  const int64_t target = std::max<int64_t>(1, 32 / mcu_w);
  int64_t best = 0;
  for (int64_t k = std::max<int64_t>(1, target / 2); k <= 2 * target; ++k)
    if (mcus_per_row % k == 0 && (best == 0 || std::llabs(k - target) < std::llabs(best - target))) best = k;
  const int64_t interval = best ? best : mcus_per_row;
  return std::min<int64_t>(interval, 65535);  // DRI holds 16 bits; a longer row is never cut
}

namespace {

// Output into one malloc'd buffer that doubles when full. Not jpeg_mem_dest: it frees and replaces its buffer
// as it grows and tells the caller only at the end, so after a longjmp the live buffer cannot be freed.
struct GrowingDestination {
  jpeg_destination_mgr pub;  // must be first
  unsigned char* buffer;
  size_t capacity;
};

void init_destination(j_compress_ptr cinfo) {
  auto* dest = reinterpret_cast<GrowingDestination*>(cinfo->dest);
  dest->pub.next_output_byte = dest->buffer;
  dest->pub.free_in_buffer = dest->capacity;
}

boolean grow_destination(j_compress_ptr cinfo) {  // called with the buffer full
  auto* dest = reinterpret_cast<GrowingDestination*>(cinfo->dest);
  const size_t capacity = dest->capacity * 2;
  auto* grown = static_cast<unsigned char*>(std::realloc(dest->buffer, capacity));
  if (grown == nullptr) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 10);
  dest->buffer = grown;
  dest->pub.next_output_byte = grown + dest->capacity;
  dest->pub.free_in_buffer = capacity - dest->capacity;
  dest->capacity = capacity;
  return TRUE;
}

void term_destination(j_compress_ptr) {}

// Copies saved APPn/COM markers, except those the encoder writes itself (JFIF APP0, Adobe APP14).
void copy_markers(j_decompress_ptr src, j_compress_ptr dst) {
  for (jpeg_saved_marker_ptr m = src->marker_list; m != nullptr; m = m->next) {
    if (dst->write_JFIF_header && m->marker == JPEG_APP0 && m->data_length >= 5 &&
        std::memcmp(m->data, "JFIF", 5) == 0)
      continue;
    if (dst->write_Adobe_marker && m->marker == JPEG_APP0 + 14 && m->data_length >= 5 &&
        std::memcmp(m->data, "Adobe", 5) == 0)
      continue;
    jpeg_write_marker(dst, m->marker, m->data, m->data_length);
  }
}

// Whether every coefficient of every component was coded to its last bit. A progressive file can stop short
// (a scan or a refinement pass missing, valid JPEG, e.g. a truncated file with its EOI put back): libjpeg-turbo
// then smooths the blocks (do_block_smoothing, on by default, also in our decoder) to estimate the missing AC
// coefficients, and other decoders or versions guess differently. A baseline copy of the coefficients decodes
// without that smoothing, to different pixels, so such files are left alone. Sequential files are complete.
bool coefficients_complete(j_decompress_ptr src) {
  if (!src->progressive_mode) return true;
  if (src->coef_bits == nullptr) return false;  // allocated by every progressive entropy decoder: never here
  for (int c = 0; c < src->num_components; ++c)
    for (int k = 0; k < DCTSIZE2; ++k)
      if (src->coef_bits[c][k] != 0) return false;  // -1: never coded; > 0: low bits still missing
  return true;
}

// The libjpeg part. destination lives in the caller's frame, so its buffer pointer is valid after a longjmp.
int transcode(const uint8_t* data, size_t size, const Limits& limits, GrowingDestination* destination,
              size_t* written, char* message, size_t message_size) {
  if (!looks_like_jpeg(data, size)) return not_jpeg(size, message, message_size);
  jpeg_decompress_struct src;
  jpeg_compress_struct dst;
  ErrorManager err;
  ProgressMonitor progress;
  src.err = install_error_manager(&err, limits.strict);
  dst.err = src.err;
  volatile bool src_created = false, dst_created = false;
  if (setjmp(err.jump)) {
    if (dst_created) jpeg_destroy_compress(&dst);
    if (src_created) jpeg_destroy_decompress(&src);
    set_message(message, message_size, err.message);
    return err.status;
  }
  jpeg_create_decompress(&src);
  src_created = true;
  install_progress(&progress, &src, limits.max_scans);
  jpeg_mem_src(&src, data, static_cast<unsigned long>(size));
  jpeg_save_markers(&src, JPEG_COM, 0xFFFF);
  for (int m = 0; m < 16; ++m) jpeg_save_markers(&src, JPEG_APP0 + m, 0xFFFF);
  read_header_marked(&src);
  const int64_t pixels = static_cast<int64_t>(src.image_width) * src.image_height;
  int status = kOk;
  if (pixels > limits.max_pixels) {
    std::snprintf(message, message_size, "image is %ux%u = %lld pixels, over the limit of %lld", src.image_width,
                  src.image_height, static_cast<long long>(pixels), static_cast<long long>(limits.max_pixels));
    status = kTooLarge;
  } else if (!(src.jpeg_color_space == JCS_YCbCr && src.num_components == 3) &&
             !(src.jpeg_color_space == JCS_GRAYSCALE && src.num_components == 1)) {
    set_message(message, message_size, "only YCbCr and grayscale JPEGs are re-encoded");
    status = kUnsupported;
  }
  if (status != kOk) {
    jpeg_destroy_decompress(&src);
    return status;
  }
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&src);
  if (!coefficients_complete(&src)) {
    set_message(message, message_size, "progressive JPEG whose scans leave coefficients incomplete: not re-encoded "
                "(decoders estimate the missing ones, a sequential copy cannot ask for that)");
    jpeg_destroy_decompress(&src);
    return kUnsupported;
  }
  jpeg_create_compress(&dst);
  dst_created = true;
  jpeg_copy_critical_parameters(&src, &dst);
  dst.optimize_coding = TRUE;
  const bool interleaved = src.num_components > 1;
  const int64_t mcu_w = interleaved ? 8 * src.max_h_samp_factor : 8;
  const int64_t mcus_per_row = (static_cast<int64_t>(src.image_width) + mcu_w - 1) / mcu_w;
  dst.restart_interval = static_cast<unsigned int>(choose_restart_interval(mcus_per_row, mcu_w));
  destination->capacity = size + size / 4 + 4096;  // usually enough: optimised tables pay for the markers
  destination->buffer = static_cast<unsigned char*>(std::malloc(destination->capacity));
  if (destination->buffer == nullptr) ERREXIT1(&dst, JERR_OUT_OF_MEMORY, 11);
  destination->pub.init_destination = init_destination;
  destination->pub.empty_output_buffer = grow_destination;
  destination->pub.term_destination = term_destination;
  dst.dest = &destination->pub;
  jpeg_write_coefficients(&dst, coefficients);
  copy_markers(&src, &dst);
  jpeg_finish_compress(&dst);
  *written = destination->capacity - destination->pub.free_in_buffer;
  jpeg_destroy_compress(&dst);
  dst_created = false;
  jpeg_finish_decompress(&src);
  report_warnings(err, message, message_size);
  jpeg_destroy_decompress(&src);
  return kOk;
}

}  // namespace

int add_restart_markers(const uint8_t* data, size_t size, const Limits& limits, std::vector<uint8_t>* out,
                        char* message, size_t message_size) {
  GrowingDestination destination{};
  size_t written = 0;
  const int status = transcode(data, size, limits, &destination, &written, message, message_size);
  try {
    if (status == kOk) out->assign(destination.buffer, destination.buffer + written);
  } catch (...) {
    std::free(destination.buffer);
    throw;
  }
  std::free(destination.buffer);
  return status;
}

}  // namespace fastload
