/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package deploy renders the Helm chart in deploy/charts/knotless with
// the pinned helm (bin/helm) and reads what a kubelet would run from it:
// each Deployment's container arguments, with $(VAR) references expanded
// from the container's environment, and the files its Secret volumes put
// into the container. The chart's tests check the arguments against the
// binaries' flag parsing, and the e2e suite runs the images with them.
package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Chart is the chart's directory, relative to the repository root.
const Chart = "deploy/charts/knotless"

// Helm returns the pinned helm binary of the repository at root, or an
// error that says how to build it.
func Helm(root string) (string, error) {
	bin := filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("no %s: build it with make chart-lint (hack/tool.sh helm helm.sh/helm/v3/cmd/helm)", bin)
	}
	return bin, nil
}

// Workload is one Deployment of the rendered chart.
type Workload struct {
	Name       string
	Deployment *appsv1.Deployment
	Container  corev1.Container
}

// Render runs helm template for the chart at root with the values files
// and values (marshalled to a file after them, so they win) and returns
// the Deployments by name.
func Render(ctx context.Context, root string, values map[string]any, files ...string) (map[string]*Workload, error) {
	return RenderChart(ctx, root, filepath.Join(root, Chart), values, files...)
}

// RenderChart is Render of another chart: a directory or a packaged
// chart (the .tgz of make release).
func RenderChart(ctx context.Context, root, chart string, values map[string]any, files ...string) (map[string]*Workload, error) {
	out, err := Template(ctx, root, chart, nil, values, files...)
	if err != nil {
		return nil, err
	}
	return Workloads(out)
}

// Template runs helm template knotless chart --namespace knotless-system
// with the flags, the values files and values (marshalled to a file after
// them, so they win) and returns the manifests.
func Template(ctx context.Context, root, chart string, flags []string, values map[string]any, files ...string) ([]byte, error) {
	helm, err := Helm(root)
	if err != nil {
		return nil, err
	}
	args := append([]string{"template", "knotless", chart, "--namespace", "knotless-system"}, flags...)
	for _, f := range files {
		args = append(args, "-f", f)
	}
	if values != nil {
		raw, err := yaml.Marshal(values)
		if err != nil {
			return nil, err
		}
		f, err := os.CreateTemp("", "knotless-values-*.yaml")
		if err != nil {
			return nil, err
		}
		defer os.Remove(f.Name())
		if _, err := f.Write(raw); err != nil {
			f.Close()
			return nil, err
		}
		if err := f.Close(); err != nil {
			return nil, err
		}
		args = append(args, "-f", f.Name())
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, helm, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm template: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Object is one rendered manifest.
type Object struct {
	Kind, APIVersion string
	Name, Namespace  string
	// Doc is the manifest as rendered.
	Doc []byte
}

// Objects splits rendered manifests into objects (empty documents left out).
func Objects(out []byte) ([]Object, error) {
	var objs []Object
	for _, doc := range splitDocs(out) {
		var meta struct {
			Kind       string `json:"kind"`
			APIVersion string `json:"apiVersion"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("rendered chart: %w", err)
		}
		if meta.Kind == "" {
			continue
		}
		objs = append(objs, Object{Kind: meta.Kind, APIVersion: meta.APIVersion, Name: meta.Metadata.Name, Namespace: meta.Metadata.Namespace, Doc: []byte(doc)})
	}
	return objs, nil
}

// RenderedSecrets returns the contents of the Secrets in objs (decoded).
func RenderedSecrets(objs []Object) (Secrets, error) {
	s := Secrets{}
	for _, o := range objs {
		if o.Kind != "Secret" {
			continue
		}
		sec := &corev1.Secret{}
		if err := yaml.UnmarshalStrict(o.Doc, sec); err != nil {
			return nil, fmt.Errorf("rendered Secret %s: %w", o.Name, err)
		}
		s[sec.Name] = map[string]string{}
		for k, v := range sec.Data {
			s[sec.Name][k] = string(v)
		}
		for k, v := range sec.StringData {
			s[sec.Name][k] = v
		}
	}
	return s, nil
}

func splitDocs(out []byte) []string {
	return regexp.MustCompile(`(?m)^---\s*$`).Split(string(out), -1)
}

// Workloads returns the Deployments of rendered manifests by name.
func Workloads(out []byte) (map[string]*Workload, error) {
	ws := map[string]*Workload{}
	for _, doc := range splitDocs(out) {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("rendered chart: %w", err)
		}
		if meta.Kind != "Deployment" {
			continue
		}
		d := &appsv1.Deployment{}
		if err := yaml.UnmarshalStrict([]byte(doc), d); err != nil {
			return nil, fmt.Errorf("rendered Deployment: %w", err)
		}
		if n := len(d.Spec.Template.Spec.Containers); n != 1 {
			return nil, fmt.Errorf("the Deployment %s has %d containers, want 1", d.Name, n)
		}
		ws[d.Name] = &Workload{Name: d.Name, Deployment: d, Container: d.Spec.Template.Spec.Containers[0]}
	}
	return ws, nil
}

// Secrets are the contents of Secrets by name and key.
type Secrets map[string]map[string]string

func (s Secrets) value(name, key string) (string, error) {
	v, ok := s[name][key]
	if !ok {
		return "", fmt.Errorf("no key %q in Secret %q", key, name)
	}
	return v, nil
}

// Env returns the container's environment as the kubelet would set it:
// literal values and Secret keys from secrets.
func (w *Workload) Env(secrets Secrets) (map[string]string, error) {
	env := map[string]string{}
	for _, e := range w.Container.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			v, err := secrets.value(e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			env[e.Name] = v
		default:
			return nil, fmt.Errorf("env %s: only values and Secret keys are supported", e.Name)
		}
	}
	return env, nil
}

// Args returns the container's arguments with $(VAR) expanded from its
// environment, as the kubelet expands them; a reference to a variable
// the container does not have is an error (the kubelet would leave it).
func (w *Workload) Args(secrets Secrets) ([]string, error) {
	env, err := w.Env(secrets)
	if err != nil {
		return nil, err
	}
	varRef := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	var errs []error
	out := make([]string, len(w.Container.Args))
	for i, a := range w.Container.Args {
		out[i] = varRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := varRef.FindStringSubmatch(ref)[1]
			v, ok := env[name]
			if !ok {
				errs = append(errs, fmt.Errorf("argument %q refers to $(%s), which the container does not have", a, name))
				return ref
			}
			return v
		})
	}
	return out, errors.Join(errs...)
}

// File is a file a Secret volume puts into the container.
type File struct {
	// Path is the file's path in the container.
	Path        string
	Secret, Key string
	// Mode is the volume's defaultMode.
	Mode os.FileMode
}

// Mount is a Secret volume's directory in the container and its files.
type Mount struct {
	Dir   string
	Files []File
}

// Mounts returns the container's Secret volume mounts (sorted by
// directory); other volumes (emptyDir) are left out.
func (w *Workload) Mounts() ([]Mount, error) {
	vols := map[string]corev1.Volume{}
	for _, v := range w.Deployment.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	var out []Mount
	for _, vm := range w.Container.VolumeMounts {
		v, ok := vols[vm.Name]
		if !ok {
			return nil, fmt.Errorf("volume mount %s has no volume", vm.Name)
		}
		if v.Secret == nil {
			continue
		}
		if len(v.Secret.Items) == 0 {
			return nil, fmt.Errorf("the Secret volume %s names no items: the chart mounts each key under a fixed name", v.Name)
		}
		mode := os.FileMode(0o644)
		if v.Secret.DefaultMode != nil {
			mode = os.FileMode(*v.Secret.DefaultMode)
		}
		m := Mount{Dir: vm.MountPath}
		for _, it := range v.Secret.Items {
			m.Files = append(m.Files, File{Path: path.Join(vm.MountPath, it.Path), Secret: v.Secret.SecretName, Key: it.Key, Mode: mode})
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dir < out[j].Dir })
	return out, nil
}

// WriteMounts writes every file of the Secret mounts under root (root
// joined with the file's path in the container), with the contents of
// secrets, readable by anyone (a container's numeric user must read the
// files when root is bind-mounted), and returns the mounts.
func (w *Workload) WriteMounts(root string, secrets Secrets) ([]Mount, error) {
	mounts, err := w.Mounts()
	if err != nil {
		return nil, err
	}
	for _, m := range mounts {
		if err := os.MkdirAll(filepath.Join(root, m.Dir), 0o755); err != nil {
			return nil, err
		}
		for _, f := range m.Files {
			v, err := secrets.value(f.Secret, f.Key)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f.Path, err)
			}
			p := filepath.Join(root, f.Path)
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				return nil, err
			}
			if err := os.Chmod(p, 0o644); err != nil {
				return nil, err
			}
		}
	}
	return mounts, nil
}

// Rebase returns args with every file path under one of the mounts'
// directories moved under root (as WriteMounts wrote them), so that the
// binaries' Validate can read them on this machine.
func Rebase(args []string, mounts []Mount, root string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		name, value, ok := strings.Cut(a, "=")
		if !ok {
			continue
		}
		for _, m := range mounts {
			if strings.HasPrefix(value, m.Dir+"/") {
				out[i] = name + "=" + filepath.Join(root, value)
			}
		}
	}
	return out
}
