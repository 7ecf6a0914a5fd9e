// Command mountdev prepares the mount topology of `make dev` (hack/dev.sh)
// with the same code the e2e suite uses: certificates, header names and
// kcp-front-proxy's configuration. It prints bash array assignments for
// dev.sh to eval.
//
//	mountdev certs DIR FRONT_PROXY_URL SHIM_ADDR
//	    new certificates and header names in DIR (certs.json), a kubeconfig
//	    DIR/admin.kubeconfig that reaches kcp through the front proxy as
//	    kcp-admin (client certificate); prints shard_args, shim_args,
//	    provider_mount_args and provider_guest_args (GuestIdentityGrants:
//	    the admission webhook, and kcp-front-proxy for the guests).
//	mountdev front-proxy DIR KCP_KUBECONFIG KCP_URL SHIM_ADDR
//	    kcp-front-proxy's mapping and root kubeconfig in DIR/front-proxy;
//	    prints front_proxy_args.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/knotless-dev/knotless/e2e/framework"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "mountdev: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 4 && args[0] == "certs":
		dir, fpURL, shimAddr := args[1], args[2], args[3]
		m, err := framework.NewMountCerts(dir)
		if err != nil {
			return err
		}
		raw, err := json.Marshal(m)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "certs.json"), raw, 0o600); err != nil {
			return err
		}
		if err := m.UserKubeconfig(filepath.Join(dir, "admin.kubeconfig"), fpURL, "kcp-admin", "system:kcp:admin"); err != nil {
			return err
		}
		printArray("shard_args", m.ShardArgs())
		printArray("shim_args", m.ShimArgs(shimAddr, fpURL))
		printArray("provider_mount_args", m.MountProxyArgs(shimAddr, fpURL))
		guest, err := m.GuestArgs(fpURL)
		if err != nil {
			return err
		}
		printArray("provider_guest_args", guest)
		return nil
	case len(args) == 5 && args[0] == "front-proxy":
		dir, kubeconfig, kcpURL, shimAddr := args[1], args[2], args[3], args[4]
		raw, err := os.ReadFile(filepath.Join(dir, "certs.json"))
		if err != nil {
			return err
		}
		m := &framework.MountCerts{}
		if err := json.Unmarshal(raw, m); err != nil {
			return err
		}
		fp, err := framework.FrontProxyConfig(filepath.Join(dir, "front-proxy"), kubeconfig, kcpURL, m, shimAddr)
		if err != nil {
			return err
		}
		printArray("front_proxy_args", fp)
		return nil
	}
	return fmt.Errorf("usage: mountdev certs DIR FRONT_PROXY_URL SHIM_ADDR | mountdev front-proxy DIR KCP_KUBECONFIG KCP_URL SHIM_ADDR")
}

// printArray prints name=('a' 'b' ...) with each value single-quoted.
func printArray(name string, values []string) {
	q := make([]string, len(values))
	for i, v := range values {
		q[i] = "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
	}
	fmt.Printf("%s=(%s)\n", name, strings.Join(q, " "))
}
