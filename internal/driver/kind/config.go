package kind

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/knotless-dev/knotless/internal/driver"
)

// Smallest shape the driver runs: an idle node (kubelet, containerd,
// etcd, the API server, the controller manager, the scheduler, CoreDNS)
// uses about 410 MiB, and its control plane's pods request 950m of CPU
// and 290 MiB out of the node's allocatable (docs/compute.md).
const (
	MinCPUMillis = 1000
	MinMemoryMiB = 1024
)

// ClusterName is the kind cluster (and the docker network) of the VM id:
// "kl-" and 32 hex digits of the id's SHA-256, so any id gives a valid
// name of 35 characters (kind warns past 50; its node container is the
// name and "-control-plane").
func ClusterName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "kl-" + hex.EncodeToString(sum[:16])
}

// NodeName is the docker container of the cluster's only node.
func NodeName(cluster string) string { return cluster + "-control-plane" }

// Capacity is what the node's kubelet sees of the docker host: all its
// CPUs and memory (a node container's /proc and /sys are the host's).
type Capacity struct {
	CPUs        int64
	MemoryBytes int64
}

// Reserved is the kubelet's systemReserved that leaves vm's shape
// allocatable on a host of capacity c: capacity minus the shape. A shape
// smaller than the driver's minimum or larger than the host is refused.
func Reserved(vm driver.VM, c Capacity) (cpuMillis, memoryBytes int64, err error) {
	if vm.CPUMillis < MinCPUMillis || vm.MemoryMiB < MinMemoryMiB {
		return 0, 0, fmt.Errorf("%w: the shape %dm CPU, %d MiB is below the kind driver's smallest node (%dm, %d MiB)", driver.ErrUnrunnable, vm.CPUMillis, vm.MemoryMiB, MinCPUMillis, MinMemoryMiB)
	}
	cpuMillis, memoryBytes = c.CPUs*1000-vm.CPUMillis, c.MemoryBytes-vm.MemoryMiB<<20
	if cpuMillis < 0 || memoryBytes < 0 {
		return 0, 0, fmt.Errorf("%w: the shape %dm CPU, %d MiB is larger than the machine", driver.ErrUnrunnable, vm.CPUMillis, vm.MemoryMiB)
	}
	return cpuMillis, memoryBytes, nil
}

// WebhookDir is where a node finds its webhook token authentication
// configuration (the VM directory's webhook/, mounted read-only), and its
// API server too.
const WebhookDir = "/etc/kubernetes/knotless-webhook"

// Config is the kind configuration of vm's cluster: one node, the API
// server on host at a port kind picks, and a kubelet whose
// systemReserved leaves the shape allocatable. With webhookDir (the
// host's folder of the webhook configuration, "" for none) the API
// server authenticates bearer tokens with the agent's service-auth
// webhook (WebhookDir/webhook.kubeconfig).
func Config(vm driver.VM, host string, c Capacity, webhookDir string) ([]byte, error) {
	cpu, mem, err := Reserved(vm, c)
	if err != nil {
		return nil, err
	}
	kubelet, err := yaml.Marshal(map[string]any{
		"apiVersion":     "kubelet.config.k8s.io/v1beta1",
		"kind":           "KubeletConfiguration",
		"systemReserved": map[string]string{"cpu": strconv.FormatInt(cpu, 10) + "m", "memory": strconv.FormatInt(mem, 10)},
	})
	if err != nil {
		return nil, err
	}
	patches := []string{string(kubelet)}
	node := map[string]any{"role": "control-plane"}
	if webhookDir != "" {
		apiServer, err := yaml.Marshal(map[string]any{
			"kind": "ClusterConfiguration",
			"apiServer": map[string]any{
				"extraArgs": []map[string]string{
					{"name": "authentication-token-webhook-config-file", "value": WebhookDir + "/webhook.kubeconfig"},
					{"name": "authentication-token-webhook-version", "value": "v1"},
					{"name": "authentication-token-webhook-cache-ttl", "value": driver.WebhookCacheTTL.String()},
				},
				"extraVolumes": []map[string]any{{"name": "knotless-webhook", "hostPath": WebhookDir, "mountPath": WebhookDir, "readOnly": true, "pathType": "Directory"}},
			},
		})
		if err != nil {
			return nil, err
		}
		patches = append(patches, string(apiServer))
		node["extraMounts"] = []map[string]any{{"hostPath": webhookDir, "containerPath": WebhookDir, "readOnly": true}}
	}
	return yaml.Marshal(map[string]any{
		"kind":                 "Cluster",
		"apiVersion":           "kind.x-k8s.io/v1alpha4",
		"name":                 ClusterName(vm.ID),
		"networking":           map[string]any{"apiServerAddress": host, "apiServerPort": 0},
		"nodes":                []map[string]any{node},
		"kubeadmConfigPatches": patches,
	})
}

// Limits are the docker flags that hold the node container to vm's
// shape: its CPU quota and its memory, swap included.
func Limits(vm driver.VM) []string {
	mem := strconv.FormatInt(vm.MemoryMiB<<20, 10)
	return []string{"--cpus", strconv.FormatFloat(float64(vm.CPUMillis)/1000, 'f', 3, 64), "--memory", mem, "--memory-swap", mem}
}

// quote is s as one word of a POSIX shell.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Script is what provisions vm's cluster, run detached in the VM's
// directory: kind creates the cluster from the node image with the
// configuration in kind.yaml (its admin kubeconfig in kubeconfig), docker
// holds the node to the shape, and kind loads the preloaded images into
// the node. It stops at the first failure.
func Script(kindBin, docker, image string, vm driver.VM, preload []string) string {
	name := ClusterName(vm.ID)
	var b strings.Builder
	b.WriteString("set -eu\n")
	fmt.Fprintf(&b, "%s create cluster --name %s --image %s --config kind.yaml --kubeconfig kubeconfig\n", quote(kindBin), name, quote(image))
	fmt.Fprintf(&b, "%s update", quote(docker))
	for _, f := range Limits(vm) {
		b.WriteString(" " + f)
	}
	fmt.Fprintf(&b, " %s\n", NodeName(name))
	if len(preload) > 0 {
		fmt.Fprintf(&b, "%s load docker-image --name %s", quote(kindBin), name)
		for _, img := range preload {
			b.WriteString(" " + quote(img))
		}
		b.WriteString("\n")
	}
	return b.String()
}
