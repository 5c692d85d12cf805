// A main() for fuzz targets without libFuzzer: runs LLVMFuzzerTestOneInput once on every file named on the
// command line (directories: every file inside). For sanitizers that libFuzzer's own coverage counters would
// trip (ThreadSanitizer sees the counters' unsynchronised increments from the batch's second thread as races).
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static int run_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return 0;
  std::vector<uint8_t> data;
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.insert(data.end(), buf, buf + n);
  std::fclose(f);
  LLVMFuzzerTestOneInput(data.data(), data.size());
  return 1;
}

int main(int argc, char** argv) {
  long runs = 0;
  for (int a = 1; a < argc; ++a) {
    struct stat st;
    if (stat(argv[a], &st) != 0) continue;
    if (!S_ISDIR(st.st_mode)) {
      runs += run_file(argv[a]);
      continue;
    }
    if (DIR* dir = opendir(argv[a])) {
      while (dirent* e = readdir(dir))
        if (e->d_name[0] != '.') runs += run_file(std::string(argv[a]) + "/" + e->d_name);
      closedir(dir);
    }
  }
  std::printf("replayed %ld inputs\n", runs);
  return 0;
}
