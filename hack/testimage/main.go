// Command testimage is the server of the test image (hack/testimage/build.sh):
// a static HTTP server, run FROM scratch in a kind VM's pods, that answers
// GET / with the memory limit and CPU quota of its own cgroup, and prints
// them when it starts (so a pod's log shows them). `testimage limits`
// prints them and exits (the image has no shell: what kubectl exec runs);
// `testimage id` prints the process's uid and gid (what an SSH session
// runs);
// `testimage alloc N` allocates and touches N MiB, 16 MiB at a time,
// printing how far it got, then waits (a pod that allocates past its
// node's memory). The server echoes every line of its stdin to stdout
// ("stdin: <line>"), so kubectl attach can be seen to pass both ways (a
// pod without stdin gets end of file at once). `testimage kcp DIR PATH...`
// is a guest of a GuestIdentityGrant: with the server, token, ca.crt and
// tls-server-name files of its Secret mounted at DIR, it GETs each PATH
// (under the server's workspace, or as given when it starts with
// /clusters/), prints "kcp GET PATH: CODE" for each, then waits.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
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
	if len(os.Args) > 3 && os.Args[1] == "kcp" {
		kcpGet(os.Args[2], os.Args[3:])
		select {}
	}
	if len(os.Args) > 1 && os.Args[1] == "id" {
		fmt.Printf("uid=%d gid=%d\n", os.Getuid(), os.Getgid())
		return
	}
	if len(os.Args) > 2 && os.Args[1] == "alloc" {
		alloc(os.Args[2])
		return
	}
	addr := ":8080"
	if p := os.Getenv("PORT"); p != "" {
		addr = ":" + p
	}
	go echo()
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

// echo prints every line of stdin, prefixed "stdin: ", until its end.
func echo() {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Printf("stdin: %s\n", in.Text())
	}
}

// alloc allocates and touches mib MiB and waits.
func alloc(mib string) {
	n, err := strconv.Atoi(mib)
	if err != nil || n <= 0 {
		log.Fatalf("alloc: %q is not a number of MiB", mib)
	}
	var held [][]byte
	for got := 0; got < n; got += 16 {
		b := make([]byte, 16<<20)
		for i := range b {
			b[i] = 1
		}
		held = append(held, b)
		fmt.Printf("allocated %d MiB\n", got+16)
	}
	fmt.Printf("holding %d MiB\n", 16*len(held))
	for {
		time.Sleep(time.Hour)
		runtime.KeepAlive(held)
	}
}

// kcpGet GETs each path from kcp with the grant's Secret mounted at dir,
// trying a path again every 2 s for a minute while kcp is not reached.
func kcpGet(dir string, paths []string) {
	file := func(name string) string { b, _ := os.ReadFile(dir + "/" + name); return strings.TrimSpace(string(b)) }
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(file("ca.crt")))
	// The guest is a workload of the tenant, not knotless: the address
	// policy of knotless's own clients (R18) is not its to keep, but it
	// follows no redirect, so a 3xx is what it prints.
	hc := &http.Client{
		Timeout:       10 * time.Second,
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: file("tls-server-name"), MinVersion: tls.VersionTLS12}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	server := file("server")
	u, err := url.Parse(server)
	if err != nil {
		log.Fatalf("kcp: server %q: %v", server, err)
	}
	for _, p := range paths {
		target := server + p
		if strings.HasPrefix(p, "/clusters/") {
			target = u.Scheme + "://" + u.Host + p
		}
		for try := 0; try < 30; try++ {
			req, _ := http.NewRequest(http.MethodGet, target, nil)
			req.Header.Set("Authorization", "Bearer "+file("token"))
			resp, err := hc.Do(req)
			if err != nil {
				fmt.Printf("kcp GET %s: %v\n", p, err)
				time.Sleep(2 * time.Second)
				continue
			}
			resp.Body.Close()
			fmt.Printf("kcp GET %s: %d\n", p, resp.StatusCode)
			break
		}
	}
}
