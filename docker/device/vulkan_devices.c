/* Every Vulkan physical device the loader sees in this container, printed as one JSON line.
 * usage: specbench-vulkan-devices
 * Unlike llama.cpp, which skips CPU-type devices unless GGML_VK_VISIBLE_DEVICES names them, this lists all of
 * them (a software device such as Mesa's lavapipe included), so the kit can say what the image sees and which
 * index to hand llama.cpp. Exit 0 with "devices": [] when the loader finds no driver. */
#include <stdio.h>
#include <string.h>
#include <vulkan/vulkan.h>

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
        case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated-gpu";
        case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete-gpu";
        case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual-gpu";
        case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
        default: return "other";
    }
}

static void version(uint32_t v) {
    printf("\"%u.%u.%u\"", VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v), VK_API_VERSION_PATCH(v));
}

int main(void) {
    uint32_t instance_version = VK_API_VERSION_1_0;
    PFN_vkEnumerateInstanceVersion enum_version =
        (PFN_vkEnumerateInstanceVersion)vkGetInstanceProcAddr(NULL, "vkEnumerateInstanceVersion");
    if (enum_version) enum_version(&instance_version);
    VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "specbench", 1, NULL, 0,
                             instance_version >= VK_API_VERSION_1_2 ? VK_API_VERSION_1_2 : VK_API_VERSION_1_0};
    VkInstanceCreateInfo info = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, NULL, 0, &app, 0, NULL, 0, NULL};
    VkInstance instance;
    VkResult r = vkCreateInstance(&info, NULL, &instance);
    printf("{\"kind\": \"vulkan-devices\", \"instance_version\": ");
    version(instance_version);
    if (r != VK_SUCCESS) {
        /* VK_ERROR_INCOMPATIBLE_DRIVER (-9): no installable client driver answered */
        printf(", \"devices\": [], \"error\": \"vkCreateInstance returned %d\"}\n", (int)r);
        return 0;
    }
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(instance, &n, NULL);
    VkPhysicalDevice devs[64];
    if (n > 64) n = 64;
    vkEnumeratePhysicalDevices(instance, &n, devs);
    printf(", \"devices\": [");
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties props;
        vkGetPhysicalDeviceProperties(devs[i], &props);
        VkPhysicalDeviceDriverProperties driver = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
        int have_driver = 0;
        if (instance_version >= VK_API_VERSION_1_2 && props.apiVersion >= VK_API_VERSION_1_2) {
            VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &driver};
            vkGetPhysicalDeviceProperties2(devs[i], &p2);
            have_driver = 1;
        }
        VkPhysicalDeviceMemoryProperties mem;
        vkGetPhysicalDeviceMemoryProperties(devs[i], &mem);
        VkDeviceSize local = 0;
        printf("%s{\"index\": %u, \"name\": ", i ? ", " : "", i);
        json_string(props.deviceName);
        printf(", \"type\": \"%s\", \"vendor_id\": %u, \"device_id\": %u, \"api_version\": ",
               type_name(props.deviceType), props.vendorID, props.deviceID);
        version(props.apiVersion);
        if (have_driver) {
            printf(", \"driver_id\": %d, \"driver_name\": ", (int)driver.driverID);
            json_string(driver.driverName);
            printf(", \"driver_info\": ");
            json_string(driver.driverInfo);
        }
        printf(", \"heaps\": [");
        for (uint32_t h = 0; h < mem.memoryHeapCount; h++) {
            int dl = (mem.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0;
            if (dl) local += mem.memoryHeaps[h].size;
            printf("%s{\"bytes\": %llu, \"device_local\": %s}", h ? ", " : "",
                   (unsigned long long)mem.memoryHeaps[h].size, dl ? "true" : "false");
        }
        /* host-visible device-local memory: one pool the CPU and the device share (UMA, ReBAR, or a CPU device) */
        int shared = 0;
        for (uint32_t t = 0; t < mem.memoryTypeCount; t++) {
            VkMemoryPropertyFlags f = mem.memoryTypes[t].propertyFlags;
            if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) shared = 1;
        }
        printf("], \"device_local_bytes\": %llu, \"host_visible_device_local\": %s}", (unsigned long long)local,
               shared ? "true" : "false");
    }
    printf("]}\n");
    vkDestroyInstance(instance, NULL);
    return 0;
}
