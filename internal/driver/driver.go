// Package driver is what knotless-agent runs VMs through: a driver
// provisions a VM with a tenant apiserver, reports on it, hands out the
// credential the mount uses on it, exports and imports its tenant's
// objects, and terminates it. Drivers are
// pluggable (a cloud's VMs, k3s on bare metal); knotless ships the process
// driver (package process), whose VMs are tenant apiserver processes on
// the agent's machine, and the kind driver (package kind), whose VMs are
// single-node Kubernetes clusters in docker containers.
package driver

import (
	"context"
	"errors"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/serviceauth"
)

// VM is what a driver is told of the VM it runs.
type VM struct {
	// ID is stable for the VM's life (the ComputeVM's UID).
	ID string
	// CPUMillis and MemoryMiB are the shape asked for.
	CPUMillis, MemoryMiB int64
	// AdminUsers and AdminGroups get every right on the tenant (the
	// mount impersonates the requester's kcp users).
	AdminUsers, AdminGroups []string
	// AdminDIDs get every right on the tenant, as the users their
	// service-auth tokens authenticate (package serviceauth).
	AdminDIDs []string
	// ServiceID is the audience of the service-auth tokens the tenant
	// accepts ("" when it accepts none).
	ServiceID string
}

// VMOf is what a driver is told of a ComputeVM (the computevm controller
// runs it, the statesync controller exports and imports its tenant).
func VMOf(vm *computev1alpha1.ComputeVM) VM {
	return VM{ID: string(vm.UID), CPUMillis: vm.Spec.CPUMillis, MemoryMiB: vm.Spec.MemoryMiB,
		AdminUsers: vm.Spec.Admins.Users, AdminGroups: vm.Spec.Admins.Groups,
		AdminDIDs: vm.Spec.AdminDIDs, ServiceID: ServiceID(vm)}
}

// ServiceID is the service identity of the ComputeVM's tenant: its
// spec.serviceDID with a fragment naming the VM, or "" without one.
func ServiceID(vm *computev1alpha1.ComputeVM) string {
	if vm.Spec.ServiceDID == "" || vm.UID == "" {
		return ""
	}
	return serviceauth.Audience(vm.Spec.ServiceDID, string(vm.UID))
}

// State is where a VM stands, as its driver sees it.
type State string

// States.
const (
	// Absent: the driver has never started this VM, or it was terminated.
	Absent State = "Absent"
	// Starting: the VM was started and does not answer yet.
	Starting State = "Starting"
	// Running: the VM's tenant apiserver answers.
	Running State = "Running"
	// Lost: the VM was started and is gone (its process died, its
	// machine went away). A driver never starts a lost VM again by
	// itself.
	Lost State = "Lost"
)

// Status is a VM's state and, once it runs, how to reach it.
type Status struct {
	State State
	// Reason says why a VM is Lost.
	Reason string
	// Endpoint is the https URL of the tenant apiserver.
	Endpoint string
	// CA is the PEM of the CA that verifies the tenant apiserver.
	CA []byte
	// ServiceID is the audience of the service-auth tokens the tenant
	// accepts ("" when it accepts none: a driver without the agent's
	// webhook, a VM started before it had one).
	ServiceID string
	// Enforced is the shape the running VM is held to, as read back from
	// it (nil for a driver that enforces none).
	Enforced *Enforced
}

// Enforced is the shape a VM is held to: the limits of its machine (a
// container's CPU quota and memory) and what its node offers pods.
type Enforced struct {
	LimitCPUMillis, LimitMemoryMiB             int64
	AllocatableCPUMillis, AllocatableMemoryMiB int64
}

// ErrLost is returned by Provision for a VM that was started and is gone:
// it is not started again.
var ErrLost = errors.New("the VM was started before and is gone")

// ErrUnrunnable is wrapped by Provision's error for a VM the driver will
// never run (a shape it cannot hold): the VM fails instead of being
// retried.
var ErrUnrunnable = errors.New("the driver cannot run this VM")

// Driver runs VMs. Every method is idempotent and may be called again
// after the agent restarted: a VM started before is adopted, never started
// twice.
type Driver interface {
	// Provision starts the VM if it is Absent, and returns its status.
	Provision(ctx context.Context, vm VM) (Status, error)
	// Status reports on the VM without changing it.
	Status(ctx context.Context, vm VM) (Status, error)
	// Credential returns the bearer token of the identity the mount uses
	// on the running VM's tenant apiserver: made for this, allowed to
	// impersonate and nothing else (never the tenant's admin).
	Credential(ctx context.Context, vm VM) (string, error)
	// AccessDIDs returns the DIDs the running VM's tenant names in its
	// RBAC (users of bindings): the agent lets them in with service-auth
	// tokens (package serviceauth), beside the VM's admin DIDs.
	AccessDIDs(ctx context.Context, vm VM) ([]string, error)
	// Terminate stops the VM and removes what the driver kept of it.
	Terminate(ctx context.Context, vm VM) error
	// Export reads the running VM's tenant objects (namespaces and
	// resources) into a snapshot (package statesync) and returns it with
	// the number of objects.
	Export(ctx context.Context, vm VM, resources []schema.GroupResource) ([]byte, int, error)
	// Import applies a snapshot to the running VM's tenant, only
	// namespaces and the kinds in allowed, and returns how many objects
	// it applied.
	Import(ctx context.Context, vm VM, snapshot []byte, allowed []schema.GroupResource) (int, error)
}

// Workloads is what a driver whose tenants run pods (kind) offers beside
// Driver: the tenant's admin configuration, which the agent's gateway
// uses to reach the tenant's Services (port-forward, EndpointSlices).
// It never leaves the agent.
type Workloads interface {
	// TenantAdmin is the running VM's tenant admin configuration.
	TenantAdmin(ctx context.Context, vm VM) (*rest.Config, error)
}
