/* cmd_kernels.c -- `reelctl kernels`: the kernel registry as a table. */
#include "ctl.h"
#include "base/error.h"
#include "kernels/registry.h"
#include <stdio.h>
#include <string.h>

int cmd_kernels(int argc, char **argv) {
    bool json = argc > 1 && !strcmp(argv[1], "--json");
    if (argc > 1 && !json) return ctl_fail_usage("kernels", "kernels: unknown option '%s'", argv[1]);
    const kern_impl_t *list[256];
    size_t n = kern_registry_list(list, 256);
    if (n > 256) n = 256;
    if (json) {
        printf("[");
        for (size_t i = 0; i < n; i++)
            printf("%s{\"op\":\"%s\",\"backend\":\"%s\",\"dtype\":\"%s\",\"name\":\"%s\","
                   "\"capturable\":%s,\"workspace\":%s}", i ? "," : "",
                   kern_op_name(list[i]->op), kern_backend_kind_name(list[i]->backend),
                   kern_dtype_name(list[i]->dtype), list[i]->name,
                   list[i]->capturable ? "true" : "false",
                   list[i]->workspace_bytes ? "true" : "false");
        printf("]\n");
        return 0;
    }
    printf("%-16s %-8s %-6s %-26s %-11s %s\n", "OP", "BACKEND", "DTYPE", "KERNEL", "CAPTURABLE", "SCRATCH");
    for (size_t i = 0; i < n; i++)
        printf("%-16s %-8s %-6s %-26s %-11s %s\n", kern_op_name(list[i]->op),
               kern_backend_kind_name(list[i]->backend), kern_dtype_name(list[i]->dtype),
               list[i]->name, list[i]->capturable ? "yes" : "no",
               list[i]->workspace_bytes ? "arena" : "-");
    return 0;
}
