// libjpeg error handling shared by the decoder and the transcoder. See jpeg_decoder.cpp for the setjmp rules:
// the setjmp stays in the function that owns the libjpeg struct; these only format and jump.
#pragma once
#include <csetjmp>
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>
#include <jerror.h>

#include "jpeg_decoder.h"

namespace fastload {
namespace detail {

struct ErrorManager {
  jpeg_error_mgr pub;  // must be first: libjpeg sees only this
  jmp_buf jump;
  bool strict;
  bool in_header;  // inside jpeg_read_header: before any entropy-coded data
  int status;      // Status to report after the jump
  int warnings;    // warnings let through (benign ones; every one with strict=false)
  char message[JMSG_LENGTH_MAX + 64];
  char warning[JMSG_LENGTH_MAX];  // the first warning let through
};

struct ProgressMonitor {
  jpeg_progress_mgr pub;  // must be first
  int max_scans;
};

// Errors that mean "a valid JPEG this libjpeg build does not decode", not damage: kUnsupported, named.
inline int error_status(j_common_ptr cinfo, char* message, size_t size) {
  const int code = cinfo->err->msg_code;
  const int p = cinfo->err->msg_parm.i[0];
  if (code == JERR_SOF_UNSUPPORTED && p >= 0xC0 && p <= 0xCF) {  // SOF3/7/11/15 lossless; 5-7, 13-15 hierarchical
    const bool lossless = (p & 3) == 3, hierarchical = (p >= 0xC5 && p <= 0xC7) || p >= 0xCD;
    std::snprintf(message, size, "unsupported: %s%sJPEG (SOF%d)", hierarchical ? "hierarchical " : "",
                  lossless ? "lossless " : "", p - 0xC0);
    return kUnsupported;
  }
  if (code == JERR_BAD_PRECISION && (p == 12 || p == 16)) {  // valid precisions libjpeg-turbo's 8-bit API refuses
    std::snprintf(message, size, "unsupported: %d-bit JPEG", p);
    return kUnsupported;
  }
  // JERR_ARITH_NOTIMPL exists only in the libjpeg 6b API's message list (Debian's libjpeg62-turbo), not in the
  // libjpeg 8 one (Ubuntu's libjpeg-turbo8): both builds must compile.
#if JPEG_LIB_VERSION < 70
  const bool not_implemented = code == JERR_ARITH_NOTIMPL || code == JERR_CONVERSION_NOTIMPL;
#else
  const bool not_implemented = code == JERR_CONVERSION_NOTIMPL;
#endif
  if (not_implemented) {
    char text[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, text);
    std::snprintf(message, size, "unsupported: %s", text);
    return kUnsupported;
  }
  (*cinfo->err->format_message)(cinfo, message);
  return kCorrupt;
}

inline void on_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  err->status = error_status(cinfo, err->message, sizeof(err->message));
  longjmp(err->jump, 1);
}

// Whether a libjpeg warning means the pixels may differ from what the encoder wrote. Harmful: premature end
// (JWRN_HIT_MARKER, JWRN_JPEG_EOF), bad Huffman/arithmetic code, must resync, bogus progression, sequential
// SOS parameters, and anything not listed. Harmless: an unknown Adobe transform or JFIF revision, a bad ICC
// marker (fastload does not use ICC), and junk bytes before a marker *in the header*. The same junk inside or
// after entropy-coded data (before an RSTn, EOI, or a later scan's markers) is what a damaged segment looks
// like: in a test of 960 one-byte flips in restart-marked ImageNet-like JPEGs it was the first warning in about
// a fifth of them, with wrong pixels every time; so it stays harmful there.
inline bool warning_harms_pixels(int code, bool in_header) {
  switch (code) {
    case JWRN_ADOBE_XFORM:
    case JWRN_JFIF_MAJOR:
    case JWRN_BOGUS_ICC:
      return false;
    case JWRN_EXTRANEOUS_DATA:
      return !in_header;
    default:
      return true;
  }
}

// msg_level < 0 is a warning ("Premature end of JPEG file", "Corrupt JPEG data: ..."); libjpeg then goes on,
// with made-up pixels after a harmful one. strict: a harmful warning is an error, not an image. Any warning let
// through is counted and the first one kept, for the caller to report (see report_warnings).
inline void on_emit_message(j_common_ptr cinfo, int msg_level) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  if (msg_level >= 0) return;  // trace messages
  err->pub.num_warnings++;
  if (err->strict && warning_harms_pixels(err->pub.msg_code, err->in_header)) {
    (*cinfo->err->format_message)(cinfo, err->message);
    err->status = kCorrupt;
    longjmp(err->jump, 1);
  }
  if (err->warnings++ == 0) (*cinfo->err->format_message)(cinfo, err->warning);
}

// After a successful call: the warnings let through, as the message of a kOk status ("" when none).
inline void report_warnings(const ErrorManager& err, char* message, size_t size) {
  if (!message || !size) return;
  if (err.warnings == 0) message[0] = '\0';
  else if (err.warnings == 1) std::snprintf(message, size, "warning: %s", err.warning);
  else std::snprintf(message, size, "warning: %s (and %d more)", err.warning, err.warnings - 1);
}

// jpeg_read_header, marking the warnings it raises as header warnings.
inline void read_header_marked(j_decompress_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  err->in_header = true;
  jpeg_read_header(cinfo, TRUE);
  err->in_header = false;
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
  err->in_header = false;
  err->status = kOk;
  err->warnings = 0;
  err->message[0] = '\0';
  err->warning[0] = '\0';
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
