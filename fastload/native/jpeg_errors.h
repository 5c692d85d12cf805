// libjpeg error handling shared by the decoder and the transcoder. See jpeg_decoder.cpp for the setjmp rules:
// the setjmp stays in the function that owns the libjpeg struct; these only format and jump.
#pragma once
#include <csetjmp>
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>

#include "jpeg_decoder.h"

namespace fastload {
namespace detail {

struct ErrorManager {
  jpeg_error_mgr pub;  // must be first: libjpeg sees only this
  jmp_buf jump;
  bool strict;
  int status;  // Status to report after the jump
  char message[JMSG_LENGTH_MAX + 64];
};

struct ProgressMonitor {
  jpeg_progress_mgr pub;  // must be first
  int max_scans;
};

inline void on_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  err->status = kCorrupt;
  longjmp(err->jump, 1);
}

// msg_level < 0 is a corrupt-data warning ("Premature end of JPEG file", "Corrupt JPEG data: ...").
// libjpeg then goes on with made-up pixels; in strict mode that is an error, not an image.
inline void on_emit_message(j_common_ptr cinfo, int msg_level) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  if (msg_level >= 0) return;  // trace messages
  err->pub.num_warnings++;
  if (err->strict) {
    (*cinfo->err->format_message)(cinfo, err->message);
    err->status = kCorrupt;
    longjmp(err->jump, 1);
  }
}

inline void on_output_message(j_common_ptr) {}

// A hostile progressive file can hold thousands of tiny scans and take minutes to decode; refuse it.
// Only ever installed on a decompressor.
inline void on_progress(j_common_ptr cinfo) {
  auto* progress = reinterpret_cast<ProgressMonitor*>(cinfo->progress);
  auto* dinfo = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (dinfo->progressive_mode && dinfo->input_scan_number > progress->max_scans) {
    auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
    std::snprintf(err->message, sizeof(err->message), "progressive JPEG has more than %d scans",
                  progress->max_scans);
    err->status = kCorrupt;
    longjmp(err->jump, 1);
  }
}

inline void install_progress(ProgressMonitor* progress, j_decompress_ptr cinfo, int max_scans) {
  progress->pub.progress_monitor = on_progress;
  progress->max_scans = max_scans;
  cinfo->progress = &progress->pub;
}

// Our handlers on top of libjpeg's defaults.
inline jpeg_error_mgr* install_error_manager(ErrorManager* err, bool strict) {
  jpeg_error_mgr* pub = jpeg_std_error(&err->pub);
  pub->error_exit = on_error_exit;
  pub->emit_message = on_emit_message;
  pub->output_message = on_output_message;
  err->strict = strict;
  err->status = kOk;
  err->message[0] = '\0';
  return pub;
}

inline void set_message(char* message, size_t size, const char* text) {
  if (message && size) std::snprintf(message, size, "%s", text);
}

inline bool looks_like_jpeg(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

inline int not_jpeg(size_t size, char* message, size_t message_size) {
  set_message(message, message_size, size == 0 ? "empty input, not a JPEG" : "not a JPEG (no SOI marker)");
  return kNotJpeg;
}

}  // namespace detail
}  // namespace fastload
