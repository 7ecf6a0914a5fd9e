// Command testimage is the server of the test image (hack/testimage/build.sh):
// a static HTTP server, run FROM scratch in a kind VM's pods, that answers
// GET / with the memory limit and CPU quota of its own cgroup, and prints
// them when it starts (so a pod's log shows them). `testimage limits`
// prints them and exits (the image has no shell: what kubectl exec runs).
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"time"
)

// Limits are a cgroup's memory limit and CPU quota ("max" when none).
type Limits struct {
	MemoryLimit string `json:"memoryLimit"`
	CPUQuota    string `json:"cpuQuota"`
	CPUPeriod   string `json:"cpuPeriod"`
	Hostname    string `json:"hostname"`
}

func read(paths ...string) string {
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return "unknown"
}

func limits() Limits {
	l := Limits{
		// cgroup v1, then v2.
		MemoryLimit: read("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"),
		CPUQuota:    read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"),
		CPUPeriod:   read("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"),
	}
	if l.CPUQuota == "unknown" {
		if f := strings.Fields(read("/sys/fs/cgroup/cpu.max")); len(f) == 2 {
			l.CPUQuota, l.CPUPeriod = f[0], f[1]
		}
	}
	l.Hostname, _ = os.Hostname()
	return l
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "limits" {
		l := limits()
		fmt.Printf("memory limit %s, cpu quota %s/%s\n", l.MemoryLimit, l.CPUQuota, l.CPUPeriod)
		return
	}
	addr := ":8080"
	if p := os.Getenv("PORT"); p != "" {
		addr = ":" + p
	}
	l := limits()
	fmt.Printf("testimage: listening on %s; memory limit %s, cpu quota %s/%s\n", addr, l.MemoryLimit, l.CPUQuota, l.CPUPeriod)
	srv := &http.Server{Addr: addr, ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(limits())
	})}
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
