/* fuzz_config.c -- libFuzzer harness: a model config from JSON text
 * (`reelctl weights init --config FILE.json`), then the parameter count of
 * what it accepted. Anything accepted must satisfy tdit_config_validate. */
#include <stdint.h>
#include <stdlib.h>
#include "model/tinydit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tdit_config_t c;
    if (tdit_config_from_json((const char *)data, size, "fuzz", &c) != 0) return 0;
    if (tdit_config_validate(&c) != 0) abort();
    if (tdit_config_params(&c) <= 0) abort();
    return 0;
}
